package meter

import "github.com/sluicehq/sluice/filter/core/llm"

// Body is the answer chunk being delivered, as a host shows it:
// ResponseBody returns at most max bytes from start of the chunk
// (core.Stream's).
type Body interface {
	ResponseBody(start, max int) ([]byte, error)
}

// Budget decides, at the end of each event of a stream that may be cut,
// whether the event may go on to the client: false cuts the stream before
// it. out is the running count of output tokens, the event's included.
type Budget interface {
	Allow(out int64) bool
}

// Shape is what Chunk made of a chunk.
type Shape struct {
	// Changed: the chunk is to be replaced by Chunk's out.
	Changed bool
	// Cut: the stream was cut in this chunk. out ends with the cut event,
	// and the answer is to end after it.
	Cut bool
}

// CutMessage is what the cut event tells the client.
const CutMessage = "sluice: the token budget of this request's key is spent; the answer was cut here"

// Chunk reads the answer's chunk of size bytes from body, slice by slice,
// and returns what it becomes.
//
// Without a budget (the stream may not be cut), or for an answer that is
// not SSE, the chunk is only read: it goes on as it is. After a cut, every
// chunk is read (the usage at the end of the answer says what it cost) and
// goes nowhere: out is empty.
//
// With a budget, the events pass whole or not at all: the bytes of an
// event not yet complete at the chunk's end are held back (up to holdMax
// bytes; an event longer than that goes out as it comes) and go out before
// the next chunk, with the rest of their event; and the first event the
// budget refuses is not sent: the chunk becomes what came before it, then
// the cut event in the request's format (llm.AppendCutEvent). When the
// refused event's first bytes already went out (it outgrew holdMax), a
// blank line ends that event first.
//
// out is appended to (a caller's buffer, reused); the chunk's bytes are
// read twice when it changes (once to count, once to copy what is kept),
// never kept.
func (s *Stream) Chunk(body Body, size int, budget Budget, holdMax int, out []byte) ([]byte, Shape, error) {
	if s.cut {
		return out, Shape{Changed: true}, s.readAll(body, 0, size)
	}
	if budget == nil || s.answer != AnswerSSE {
		return out, Shape{}, s.readAll(body, 0, size)
	}
	cutAt, cut, err := s.events(body, size, budget)
	if err != nil {
		return out, Shape{}, err
	}
	if cut {
		return s.cutAt(body, size, cutAt, out)
	}
	return s.hold(body, size, holdMax, out)
}

// readAll writes the chunk's bytes from start on into the answer's reader.
func (s *Stream) readAll(body Body, start, size int) error {
	for start < size {
		p, err := body.ResponseBody(start, min(SliceBytes, size-start))
		if err != nil {
			return err
		}
		if len(p) == 0 {
			return nil // shorter than the host said: nothing more to read
		}
		s.Write(p)
		start += len(p)
	}
	return nil
}

// events writes the chunk into the SSE reader event by event, asking the
// budget at the end of each, and returns where the event it refused begins
// (relative to the chunk: negative when it began in an earlier chunk).
func (s *Stream) events(body Body, size int, budget Budget) (cutAt int, cut bool, err error) {
	for start := 0; start < size; {
		p, err := body.ResponseBody(start, min(SliceBytes, size-start))
		if err != nil {
			return 0, false, err
		}
		if len(p) == 0 {
			return 0, false, nil
		}
		for off := 0; off < len(p); {
			before := int(s.sse.Pending())
			n, ended := s.sse.WriteEvent(p[off:])
			if ended && !budget.Allow(s.sse.OutputTokens()) {
				// The rest of the chunk is read too: its usage counts.
				if err := s.readAll(body, start+off+n, size); err != nil {
					return 0, false, err
				}
				return start + off - before, true, nil
			}
			off += n
		}
		start += len(p)
	}
	return 0, false, nil
}

// hold shapes a chunk the budget let through: held bytes go out first, and
// the bytes of an event still unfinished are held back.
func (s *Stream) hold(body Body, size, holdMax int, out []byte) ([]byte, Shape, error) {
	tail := int(s.sse.Pending())
	tailStart := size - tail // where the unfinished event begins (< 0: before this chunk)
	switch {
	case tail == 0 && len(s.held) == 0:
		s.headSent = false
		return out, Shape{}, nil // the usual case: events end at chunk ends
	case tail == 0:
		out = append(out, s.held...)
		s.held, s.headSent = s.held[:0], false
		out, err := s.copy(body, 0, size, out)
		return out, Shape{Changed: true}, err
	case tailStart < 0 && s.headSent:
		return out, Shape{}, nil // the event outgrew the bound: it goes out as it comes
	case tailStart < 0 && len(s.held)+size <= holdMax:
		// Still within one event: all of the chunk is held.
		held, err := s.copy(body, 0, size, s.held)
		s.held = held
		return out, Shape{Changed: true}, err
	case tailStart < 0:
		// The event outgrows the bound: what is held goes out, and so does
		// the rest of it as it comes.
		s.Overlong++
		out = append(out, s.held...)
		s.held, s.headSent = s.held[:0], true
		out, err := s.copy(body, 0, size, out)
		return out, Shape{Changed: true}, err
	}
	// Events ended in this chunk, and another began.
	out = append(out, s.held...)
	s.held, s.headSent = s.held[:0], false
	out, err := s.copy(body, 0, tailStart, out)
	if err != nil {
		return out, Shape{}, err
	}
	if tail > holdMax {
		s.Overlong++
		s.headSent = true
		out, err = s.copy(body, tailStart, size, out)
	} else {
		s.held, err = s.copy(body, tailStart, size, s.held)
	}
	return out, Shape{Changed: true}, err
}

// cutAt ends the stream before the event that begins at cutAt (relative to
// the chunk): what came before it, then the cut event.
func (s *Stream) cutAt(body Body, size, cutAt int, out []byte) ([]byte, Shape, error) {
	s.cut, s.Cuts = true, s.Cuts+1
	var err error
	switch {
	case cutAt >= 0:
		out = append(out, s.held...)
		out, err = s.copy(body, 0, cutAt, out)
	case s.headSent || -cutAt > len(s.held):
		// The refused event's first bytes are out: end it, as it is.
		out = append(out, s.held...)
		out = append(out, "\n\n"...)
	default:
		// The refused event began in an earlier chunk: the held bytes are
		// its first ones, and go nowhere.
		out = append(out, s.held[:len(s.held)+cutAt]...)
	}
	s.held, s.headSent = s.held[:0], false
	out = llm.AppendCutEvent(out, s.Format, CutMessage, s.sse.NextSequence())
	return out, Shape{Changed: true, Cut: true}, err
}

// copy appends the chunk's bytes [from, to) to dst.
func (s *Stream) copy(body Body, from, to int, dst []byte) ([]byte, error) {
	for from < to {
		p, err := body.ResponseBody(from, min(SliceBytes, to-from))
		if err != nil {
			return dst, err
		}
		if len(p) == 0 {
			return dst, nil
		}
		dst = append(dst, p...)
		from += len(p)
	}
	return dst, nil
}
