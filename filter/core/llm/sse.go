package llm

import "github.com/sluicehq/sluice/filter/core/llm/internal/jsonscan"

// DefaultMaxEventBytes bounds one SSE event: 4 MiB. Nothing of an event
// is buffered (its data goes through the JSON scanner as it comes), so
// the bound is not about memory: an event that never ends, or one far
// larger than any provider sends (the Responses API's response.completed
// repeats the whole answer, so it is the largest: 4 MiB is about a
// million tokens), stops being read and is counted.
const DefaultMaxEventBytes = 4 << 20

// StreamOptions configures an SSEReader.
type StreamOptions struct {
	Ratio         Ratio // estimates tokens from generated text; 0: DefaultRatio
	MaxEventBytes int64 // bytes of one event, its lines and line ends; 0: DefaultMaxEventBytes
}

// lineState is where the SSEReader is in a line.
type lineState uint8

const (
	lnStart  lineState = iota // at the start of a line
	lnField                   // in a field name
	lnSpace                   // after "data:": one space may follow
	lnData                    // in a data line's value
	lnIgnore                  // in a comment or a field other than data
)

// SSEReader reads the usage of a streamed answer (text/event-stream) fed
// chunk by chunk, and counts its output tokens as they pass. Chunks may
// split the stream anywhere. Each event's data is scanned as it comes and
// never kept: the reader's memory is its own struct (about 2.6 KiB, half
// of it the memo that lets an event skip the prefix it shares with the
// one before), whatever the answer's length. Reuse one with Reset.
type SSEReader struct {
	sc   jsonscan.Scanner
	memo jsonscan.Memo
	st   answerState
	max  int64

	line     lineState
	crSkip   bool // the last line ended with CR: an LF right after is part of that line end
	fieldLen int
	field    [4]byte

	// The event in progress.
	evBytes   int64 // its bytes so far (lines and line ends)
	dataBytes int64 // its data, data lines joined with LF
	hasData   bool
	first     bool // in its first data line (the one the memo serves)
	over      bool // longer than max: no longer read
	noMemo    bool // tests: read every event whole
	ended     bool // an event ended in the chunk being written (WriteEvent)
	headLen   int
	head      [6]byte // the first data bytes, to know "[DONE]"
}

// NewSSEReader returns an SSEReader.
func NewSSEReader(o StreamOptions) *SSEReader {
	r := new(SSEReader)
	r.Reset(o)
	return r
}

// Reset makes r ready for a new answer.
func (r *SSEReader) Reset(o StreamOptions) {
	*r = SSEReader{max: o.MaxEventBytes}
	if r.max <= 0 {
		r.max = DefaultMaxEventBytes
	}
	r.st.ratio = o.Ratio
	r.sc.Init(answerSchema)
}

// OutputTokens is the running count of output tokens in the events read
// so far: the provider's own count where it gives one (Anthropic's
// message_delta, a final usage), plus the text that came after it
// estimated with the Ratio (OpenAI chat's choices[].delta, the Responses
// API's *.delta events, Anthropic's content_block_delta text,
// partial_json and thinking). It never decreases. An event counts once it
// is complete; an oversized event's data bytes count as text.
func (r *SSEReader) OutputTokens() int64 { return r.st.out }

// Pending is the number of bytes written since the last event ended: the
// tail of the stream that belongs to an event not yet complete. A caller
// that cuts the stream drops them when they are still in its hands, so
// that the client does not get half an event before the cut event.
func (r *SSEReader) Pending() int64 { return r.evBytes }

// NextSequence is the sequence_number for an event that follows those read
// (the Responses API numbers its events): the last one seen plus 1, or 0.
func (r *SSEReader) NextSequence() int64 {
	if !r.st.hasSeq {
		return 0
	}
	return r.st.seq + 1
}

// Result is what the answer gave so far. At the end of the body, a last
// event without the blank line that ends it is taken when its data is one
// complete JSON object, and counted as malformed otherwise.
func (r *SSEReader) Result() Result {
	if r.first && !r.over && !r.noMemo {
		r.memo.Flush(&r.sc) // the scanner reads what the memo held back
	}
	st := r.st
	// A last line "data" or "data:" without its line end is an empty data
	// line: an event that is not JSON.
	hasData := r.hasData || r.line == lnSpace || r.line == lnField && r.isData()
	if hasData || r.over {
		r.finish(&st, hasData)
	}
	return st.result()
}

// Write reads the next chunk of the stream.
func (r *SSEReader) Write(p []byte) { r.write(p, false) }

// WriteEvent reads the stream from the start of p up to the end of the
// first event that ends in it (its blank line included), or all of p, and
// returns how many bytes it read and whether an event ended there. A
// caller that cuts a stream feeds it event by event, so as to cut between
// two events. A blank line that ends no event (nothing came since the last
// one) ends none.
func (r *SSEReader) WriteEvent(p []byte) (n int, ended bool) { return r.write(p, true) }

// write is Write, and WriteEvent when event is set.
func (r *SSEReader) write(p []byte, event bool) (int, bool) {
	r.ended = false
	i := 0
	for i < len(p) {
		if event && r.ended {
			if r.crSkip && p[i] == '\n' { // the CR LF that ended the event
				r.crSkip = false
				i++
			}
			r.st.stats.Bytes += int64(i)
			return i, true
		}
		c := p[i]
		if r.crSkip {
			r.crSkip = false
			if c == '\n' {
				r.evBytes++
				i++
				continue
			}
		}
		switch r.line {
		case lnData:
			i += r.dataLine(p[i:])
			if i < len(p) && (p[i] == '\n' || p[i] == '\r') {
				r.endLine(p[i])
				i++
			}
		case lnIgnore:
			n := jsonscan.LineEnd(p[i:])
			r.count(int64(n))
			if i += n; i < len(p) {
				r.endLine(p[i])
				i++
			}
		case lnSpace:
			r.startData()
			r.line = lnData
			if c == ' ' {
				r.count(1)
				i++
			}
		default:
			if r.line == lnStart {
				// The two fields of every event, whole, at once.
				if n := fieldAt(p[i:]); n > 0 {
					r.count(int64(n))
					i += n
					r.line = lnIgnore
					if n == len("data:") {
						r.line = lnSpace
					}
					continue
				}
			}
			i++
			if c == '\r' || c == '\n' {
				r.endLine(c)
				continue
			}
			r.count(1)
			switch {
			case c == ':' && r.line == lnStart:
				r.line = lnIgnore // a comment
			case c == ':':
				r.line = lnIgnore
				if r.isData() {
					r.line = lnSpace
				}
			default:
				r.line = lnField
				if r.fieldLen < len(r.field) {
					r.field[r.fieldLen] = c
				}
				r.fieldLen++
			}
		}
	}
	r.st.stats.Bytes += int64(i)
	return i, r.ended
}

// fieldAt is the length of "data:" or "event:" when p starts with one.
func fieldAt(p []byte) int {
	switch {
	case len(p) >= 5 && p[0] == 'd' && p[1] == 'a' && p[2] == 't' && p[3] == 'a' && p[4] == ':':
		return 5
	case len(p) >= 6 && p[0] == 'e' && p[1] == 'v' && p[2] == 'e' && p[3] == 'n' && p[4] == 't' && p[5] == ':':
		return 6
	}
	return 0
}

// isData reports whether the field name read is "data".
func (r *SSEReader) isData() bool {
	return r.fieldLen == len(r.field) && string(r.field[:]) == "data"
}

// count adds n bytes to the event in progress.
func (r *SSEReader) count(n int64) {
	r.evBytes += n
	if r.evBytes > r.max {
		r.over = true
	}
}

// endLine ends a line whose end is c.
func (r *SSEReader) endLine(c byte) {
	r.count(1)
	r.crSkip = c == '\r'
	switch r.line {
	case lnStart:
		r.dispatch()
	case lnField:
		if r.isData() { // "data" alone: an empty data line
			r.startData()
		}
	case lnSpace:
		r.startData()
	}
	if r.first && !r.noMemo {
		r.memo.End(&r.sc, r.over)
	}
	r.first = false
	r.line, r.fieldLen = lnStart, 0
}

// newline joins data lines.
var newline = []byte{'\n'}

// startData starts a data line.
func (r *SSEReader) startData() {
	if r.hasData {
		r.feed(newline)
	} else {
		r.first = true
		r.memo.Begin()
	}
	r.hasData = true
}

// dataLine reads a data line's value from the start of p, up to its end
// or the event's bound, and returns how many bytes it took.
func (r *SSEReader) dataLine(p []byte) int {
	var n int
	if r.over {
		n = jsonscan.LineEnd(p)
	} else {
		// Up to one byte past the bound, which makes the event oversized.
		q := p[:min(int64(len(p)), r.max-r.evBytes+1)]
		if r.first && !r.noMemo {
			n = r.memo.Line(&r.sc, q)
		} else {
			n = r.sc.WriteLine(q)
		}
	}
	if r.headLen < len(r.head) {
		r.headLen += copy(r.head[r.headLen:], p[:n])
	}
	r.dataBytes += int64(n)
	r.count(int64(n))
	return n
}

// feed adds b to the event's data.
func (r *SSEReader) feed(b []byte) {
	if r.headLen < len(r.head) {
		r.headLen += copy(r.head[r.headLen:], b)
	}
	r.dataBytes += int64(len(b))
	if !r.over {
		r.sc.Write(b)
	}
}

// dispatch ends the event in progress (at a blank line).
func (r *SSEReader) dispatch() {
	if r.hasData || r.over {
		r.finish(&r.st, r.hasData)
	}
	r.ended = r.ended || r.evBytes > 1 // more than this blank line's own byte
	r.sc.Reset()
	r.evBytes, r.dataBytes, r.hasData, r.over, r.headLen = 0, 0, false, false, 0
}

// finish adds the event in progress to st.
func (r *SSEReader) finish(st *answerState, hasData bool) {
	if hasData {
		st.stats.Events++
	}
	switch {
	case r.over:
		st.stats.Oversized++
		st.addText(r.dataBytes) // unread: counted as text, so a cut stream does not run on
	case r.dataBytes == int64(len(r.head)) && string(r.head[:]) == "[DONE]":
		st.stats.Done = true
	case r.sc.Complete():
		st.commit(&r.sc)
	default:
		st.stats.Malformed++
	}
}
