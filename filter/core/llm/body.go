package llm

import "github.com/sluicehq/sluice/filter/core/llm/internal/jsonscan"

// JSONReader reads the usage of an answer that is not streamed (one JSON
// object, application/json), fed chunk by chunk. The usage object may
// come anywhere in the body; nothing of the body is kept: the reader's
// memory is its own struct (about 1 KiB), whatever the body's size.
// Reuse one with Reset.
type JSONReader struct {
	sc jsonscan.Scanner
	st answerState
}

// NewJSONReader returns a JSONReader.
func NewJSONReader() *JSONReader {
	r := new(JSONReader)
	r.Reset()
	return r
}

// Reset makes r ready for a new answer.
func (r *JSONReader) Reset() {
	r.sc.Init(answerSchema)
	r.st = answerState{}
}

// Write reads the next chunk of the body.
func (r *JSONReader) Write(p []byte) {
	r.st.stats.Bytes += int64(len(p))
	r.sc.Write(p)
}

// Result is what the body gave, once all of it was written: its usage
// when the body is one complete JSON object (else Stats.Malformed is 1
// and the usage is missing: a truncated body's counts are not trusted).
func (r *JSONReader) Result() Result {
	st := r.st
	if r.sc.Complete() {
		st.commit(&r.sc)
	} else {
		st.stats.Malformed++
	}
	return st.result()
}
