package llm

import "github.com/sluicehq/sluice/filter/core/llm/internal/jsonscan"

// RequestStatus is what reading a request body came to.
type RequestStatus uint8

const (
	// RequestOK: the body is one JSON object; the Request's fields hold
	// what it gave (a shape this package does not know gives no model, no
	// maximum output and no prompt text: the caller's defaults apply).
	RequestOK RequestStatus = iota
	// RequestTooLarge: the body is longer than the reader's maximum; it
	// was not read. The caller charges its configured default reserve and
	// counts it.
	RequestTooLarge
	// RequestMalformed: the body is not one JSON object (not JSON, not an
	// object, truncated, empty, or nested deeper than 64 levels).
	RequestMalformed
)

// String names the status as metrics and logs do.
func (s RequestStatus) String() string {
	switch s {
	case RequestTooLarge:
		return "too_large"
	case RequestMalformed:
		return "malformed"
	default:
		return "ok"
	}
}

// Request is what a request body says about the answer's cost, in the
// shapes of OpenAI's chat completions and responses and Anthropic's
// messages (one reader reads all three: see doc.go).
type Request struct {
	Status RequestStatus
	// Model is the model name ("" when absent, not a string, or longer
	// than MaxModelBytes: the weight table's default row applies).
	Model string
	// MaxOutput is the largest of max_tokens, max_completion_tokens and
	// max_output_tokens; MaxOutputSet says whether any was a whole number
	// in [0, MaxTokens] (the caller applies its default when not).
	MaxOutput    int64
	MaxOutputSet bool
	// Choices is OpenAI chat's n: how many answers share the maximum
	// output each (1 when absent or invalid).
	Choices int64
	// PromptBytes is the prompt's text, in bytes: message contents
	// (strings, and the text of content parts and blocks), system,
	// instructions, input, tool call arguments and outputs, plus the JSON
	// of tool definitions and tool inputs as written. Images, audio and
	// files are not counted (their tokens do not follow their bytes).
	PromptBytes int64
	// Stream is the request's stream, IncludeUsage its
	// stream_options.include_usage (OpenAI chat sends the usage in the
	// stream only then).
	Stream, IncludeUsage bool
}

// MaxModelBytes bounds the model name kept.
const MaxModelBytes = 256

// PromptTokens estimates the prompt's tokens with ratio.
func (q *Request) PromptTokens(ratio Ratio) int64 {
	return ratio.Tokens(q.PromptBytes)
}

// Usage is the usage a reserve assumes: the prompt's estimate as uncached
// input, and as output the maximum output (defaultMax when the request
// gives none) times Choices.
func (q *Request) Usage(ratio Ratio, defaultMax int64) Usage {
	out := defaultMax
	if q.MaxOutputSet {
		out = q.MaxOutput
	}
	n := q.Choices
	if n < 1 {
		n = 1
	}
	return Usage{Input: q.PromptTokens(ratio), Output: mulSat(out, n)}
}

// Reserve is the tokens to reserve for the request: the prompt's estimate
// plus the maximum output, saturating at MaxTokens.
func (q *Request) Reserve(ratio Ratio, defaultMax int64) int64 {
	return q.Usage(ratio, defaultMax).Total()
}

// Slots of the request schema.
const (
	reqMaxTokens = iota
	reqMaxCompletion
	reqMaxOutput
	reqChoices

	reqStream       = 0
	reqIncludeUsage = 1

	reqText = 0 // counter: text bytes
	reqRaw  = 1 // counter: JSON bytes of tools and tool inputs

	reqModel = 0 // capture
)

var requestSchema = newRequestSchema()

func newRequestSchema() *jsonscan.Schema {
	s := jsonscan.NewSchema()
	s.Capture(reqModel, MaxModelBytes)
	root := s.New()
	// text is any value that holds prompt text: a string is measured, an
	// array's elements and an object's text members are text again.
	// Containers that only lead to text (tool_calls, function) are
	// descended without measuring their strings (ids, names, types).
	text, path := s.New(), s.New()
	textMembers := members(text, "content", "text", "arguments", "output", "refusal")
	textMembers = append(textMembers, members(path, "tool_calls", "function")...)
	raw := jsonscan.Def{Raw: at(reqRaw)}
	input := jsonscan.Def{Raw: at(reqRaw), Measure: at(reqText)}
	textMembers = append(textMembers, member("input", s.Add(input))) // Anthropic's tool_use input: an object
	t := object(textMembers...)
	t.Array, t.Elem, t.Measure = true, text, at(reqText)
	s.Set(text, t)
	p := object(textMembers...)
	p.Array, p.Elem = true, path
	s.Set(path, p)
	s.Set(root, object(
		member("model", s.Add(jsonscan.Def{Capture: at(reqModel)})),
		member("max_tokens", s.Add(jsonscan.Def{Int: at(reqMaxTokens)})),
		member("max_completion_tokens", s.Add(jsonscan.Def{Int: at(reqMaxCompletion)})),
		member("max_output_tokens", s.Add(jsonscan.Def{Int: at(reqMaxOutput)})),
		member("n", s.Add(jsonscan.Def{Int: at(reqChoices)})),
		member("stream", s.Add(jsonscan.Def{Bool: at(reqStream)})),
		member("stream_options", s.Add(object(member("include_usage", s.Add(jsonscan.Def{Bool: at(reqIncludeUsage)}))))),
		member("messages", text), member("system", text), member("input", text), member("instructions", text),
		member("tools", s.Add(raw)),
	))
	return s
}

// RequestReader reads a request body fed in pieces, up to a maximum,
// keeping nothing of it: its memory is its own struct (about 1 KiB).
// Reuse one with Reset.
type RequestReader struct {
	sc        jsonscan.Scanner
	max       int64
	n         int64
	lastModel string // the last model name, reused while requests name the same model
}

// NewRequestReader returns a RequestReader for bodies of at most maxBody
// bytes.
func NewRequestReader(maxBody int64) *RequestReader {
	r := new(RequestReader)
	r.sc.Init(requestSchema)
	r.max = maxBody
	return r
}

// Reset makes r ready for a new body of at most maxBody bytes.
func (r *RequestReader) Reset(maxBody int64) {
	r.sc.Reset()
	r.max, r.n = maxBody, 0
}

// Write reads the next piece of the body. Past the maximum it only counts.
func (r *RequestReader) Write(p []byte) {
	r.n += int64(len(p))
	if r.n <= r.max {
		r.sc.Write(p)
	}
}

// Result is what the body said, once all of it was written.
func (r *RequestReader) Result() Request {
	switch {
	case r.n > r.max:
		return Request{Status: RequestTooLarge}
	case !r.sc.Complete():
		return Request{Status: RequestMalformed}
	}
	q := Request{Status: RequestOK, Choices: 1}
	if m, over := r.sc.Captured(reqModel); len(m) > 0 && !over {
		if string(m) != r.lastModel {
			r.lastModel = string(m)
		}
		q.Model = r.lastModel
	}
	for _, slot := range [...]int{reqMaxTokens, reqMaxCompletion, reqMaxOutput} {
		if v, set, _ := r.sc.Values().Int(slot); set {
			q.MaxOutputSet = true
			q.MaxOutput = max(q.MaxOutput, v)
		}
	}
	if v, set, _ := r.sc.Values().Int(reqChoices); set && v >= 1 {
		q.Choices = v
	}
	q.Stream, _ = r.sc.Values().Bool(reqStream)
	q.IncludeUsage, _ = r.sc.Values().Bool(reqIncludeUsage)
	q.PromptBytes = addSat(r.sc.Values().Counter(reqText), r.sc.Values().Counter(reqRaw))
	return q
}

// ReadRequest reads a whole request body of at most maxBody bytes.
func ReadRequest(body []byte, maxBody int64) Request {
	var r RequestReader
	r.sc.Init(requestSchema)
	r.max = maxBody
	r.Write(body)
	return r.Result()
}
