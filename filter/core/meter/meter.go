// Package meter measures one LLM stream for the filter's token limits,
// without a host: the reserve its request asks for (its body read within a
// bound), the usage its answer reports (a JSON body or an SSE stream, read
// by package llm's readers chunk by chunk), and, for a stream that may be
// cut when its budget runs out, the shape of each chunk: events pass whole
// or not at all, and the cut event ends the answer between two events.
//
// A Stream keeps nothing of the bodies but, for a stream that may be cut,
// the bytes of one unfinished SSE event (at most its hold bound). Streams
// come from a Pool and go back to it when their stream ends, readers and
// buffers kept for the next one: a worker allocates nothing per chunk, and
// holds at most one Stream per stream in flight.
package meter

import "github.com/sluicehq/sluice/filter/core/llm"

// SliceBytes is the most bytes of a body read at once: a host hands the
// slice through a scratch arena, which a larger read would outgrow.
const SliceBytes = 16 << 10

// Answer is the kind of an answer's body.
type Answer uint8

// The kinds of answers.
const (
	AnswerNone Answer = iota // not read
	AnswerJSON               // one JSON object (application/json and anything not SSE)
	AnswerSSE                // text/event-stream
)

// AnswerOf returns the kind of an answer by its content type.
func AnswerOf(contentType string) Answer {
	const sse = "text/event-stream"
	for i := 0; i+len(sse) <= len(contentType); i++ {
		if equalFold(contentType[i:i+len(sse)], sse) {
			return AnswerSSE
		}
	}
	return AnswerJSON
}

// equalFold compares ASCII strings of one length, ignoring case.
func equalFold(a, b string) bool {
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// Stream is the measure of one stream. Get one from a Pool.
type Stream struct {
	req     *llm.RequestReader
	json    *llm.JSONReader
	sse     *llm.SSEReader
	answer  Answer
	reading bool  // the request body is being read
	reqRead int64 // request body bytes written
	reqMax  int64

	// Request is what the request body said (its Status), once read.
	Request llm.Request
	// Format is the API the request went to (by its path): the shape of
	// the cut event.
	Format llm.Format

	// A stream that may be cut (Chunk).
	held     []byte // the bytes of an unfinished event, held back
	headSent bool   // the unfinished event's first bytes went out: it outgrew the hold bound
	cut      bool   // the stream was cut: what follows goes nowhere
	// Stats of the answer's chunks.
	Cuts, Overlong int
}

// BeginRequest starts reading a request body of at most max bytes.
func (s *Stream) BeginRequest(max int64) {
	if s.req == nil {
		s.req = llm.NewRequestReader(max)
	} else {
		s.req.Reset(max)
	}
	s.reading, s.Request, s.reqRead, s.reqMax = true, llm.Request{}, 0, max
}

// Reading reports whether a request body is being read.
func (s *Stream) Reading() bool { return s.reading }

// WriteRequest reads the next piece of the request body.
func (s *Stream) WriteRequest(p []byte) {
	s.reqRead += int64(len(p))
	s.req.Write(p)
}

// RequestRead returns the request body bytes written so far.
func (s *Stream) RequestRead() int64 { return s.reqRead }

// RequestOver reports whether the request body is longer than its bound:
// the rest need not be read.
func (s *Stream) RequestOver() bool { return s.reqRead > s.reqMax }

// EndRequest ends the request body (all of it was written, or more than
// its bound) and returns what it said.
func (s *Stream) EndRequest() llm.Request {
	s.Request = s.req.Result()
	s.reading = false
	return s.Request
}

// BeginAnswer starts reading an answer of kind a (AnswerNone: none).
func (s *Stream) BeginAnswer(a Answer, o llm.StreamOptions) {
	s.answer, s.held, s.headSent, s.cut = a, s.held[:0], false, false
	switch a {
	case AnswerJSON:
		if s.json == nil {
			s.json = llm.NewJSONReader()
		} else {
			s.json.Reset()
		}
	case AnswerSSE:
		if s.sse == nil {
			s.sse = llm.NewSSEReader(o)
		} else {
			s.sse.Reset(o)
		}
	}
}

// Answer returns the kind of the answer being read.
func (s *Stream) Answer() Answer { return s.answer }

// Write reads the next piece of the answer.
func (s *Stream) Write(p []byte) {
	switch s.answer {
	case AnswerJSON:
		s.json.Write(p)
	case AnswerSSE:
		s.sse.Write(p)
	}
}

// OutputTokens is the running count of the answer's output tokens (an SSE
// answer's; 0 for the others).
func (s *Stream) OutputTokens() int64 {
	if s.answer != AnswerSSE {
		return 0
	}
	return s.sse.OutputTokens()
}

// Result is what the answer said, once all of it was written.
func (s *Stream) Result() llm.Result {
	switch s.answer {
	case AnswerJSON:
		return s.json.Result()
	case AnswerSSE:
		return s.sse.Result()
	}
	return llm.Result{}
}

// Cut reports whether the stream was cut.
func (s *Stream) Cut() bool { return s.cut }

// Pool keeps the Streams of the streams that ended, for the next ones. It
// is not safe for concurrent use (a worker's).
type Pool struct {
	free []*Stream
	live int
}

// maxKeptHeld bounds the held buffer a Stream keeps in the pool: a rare
// long event's buffer is dropped, not kept for every later stream.
const maxKeptHeld = 4 << 10

// Get returns a Stream, empty.
func (p *Pool) Get() *Stream {
	p.live++
	if n := len(p.free); n > 0 {
		s := p.free[n-1]
		p.free[n-1] = nil
		p.free = p.free[:n-1]
		return s
	}
	return new(Stream)
}

// Put gives s back; the caller forgets it.
func (p *Pool) Put(s *Stream) {
	p.live--
	held := s.held[:0]
	if cap(held) > maxKeptHeld {
		held = nil
	}
	*s = Stream{req: s.req, json: s.json, sse: s.sse, held: held}
	p.free = append(p.free, s)
}

// Live returns the Streams given out and not back.
func (p *Pool) Live() int { return p.live }
