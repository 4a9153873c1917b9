package llm

import "github.com/sluicehq/sluice/filter/llm/internal/jsonscan"

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
// never kept: the reader's memory is its own struct (about 1.5 KiB),
// whatever the answer's length. Reuse one with Reset.
type SSEReader struct {
	sc  jsonscan.Scanner
	st  answerState
	max int64

	line     lineState
	crSkip   bool // the last line ended with CR: an LF right after is part of that line end
	fieldLen int
	field    [4]byte

	// The event in progress.
	evBytes   int64 // its bytes so far (lines and line ends)
	dataBytes int64 // its data, data lines joined with LF
	hasData   bool
	over      bool // longer than max: no longer read
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
	st := r.st
	if r.hasData || r.over {
		r.finish(&st)
	}
	return st.result()
}

// Write reads the next chunk of the stream.
func (r *SSEReader) Write(p []byte) {
	r.st.stats.Bytes += int64(len(p))
	for i := 0; i < len(p); {
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
		case lnData, lnIgnore:
			j := i
			for j < len(p) && p[j] != '\n' && p[j] != '\r' {
				j++
			}
			if r.line == lnData {
				r.data(p[i:j])
			} else {
				r.count(int64(j - i))
			}
			if i = j; i < len(p) {
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
	r.line, r.fieldLen = lnStart, 0
}

// newline joins data lines.
var newline = []byte{'\n'}

// startData starts a data line.
func (r *SSEReader) startData() {
	if r.hasData {
		r.feed(newline)
	}
	r.hasData = true
}

// data takes bytes of a data line.
func (r *SSEReader) data(b []byte) {
	if len(b) > 0 {
		r.count(int64(len(b)))
		r.feed(b)
	}
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
		r.finish(&r.st)
	}
	r.sc.Reset()
	r.evBytes, r.dataBytes, r.hasData, r.over, r.headLen = 0, 0, false, false, 0
}

// finish adds the event in progress to st.
func (r *SSEReader) finish(st *answerState) {
	if r.hasData {
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
