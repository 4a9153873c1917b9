package stack

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// A UsageUpstream answers like an LLM API when a request names a format
// (LLMFormatHeader): OpenAI's chat completions or Responses API, or
// Anthropic's messages, as one JSON body or as an SSE stream, with the
// usage the request asks for in the usage object where that API puts it.
// Each output token is the text "abcd" (4 bytes: one token at the filter's
// default 4 bytes a token), so that the filter's running count of a stream
// is exact.
const (
	// LLMFormatHeader: "openai_chat", "openai_responses" or "anthropic".
	LLMFormatHeader = "x-test-format"
	// LLMStreamHeader: "1" answers with an SSE stream, else one JSON body.
	LLMStreamHeader = "x-test-sse"
	// LLMInputHeader and LLMCachedHeader: the input tokens read from no
	// cache and from a cache, reported in the usage (UsageTokensHeader is
	// the output tokens).
	LLMInputHeader  = "x-test-input-tokens"
	LLMCachedHeader = "x-test-cached-tokens"
	// LLMWriteHeader: the answer is written (and flushed) in pieces of this
	// many bytes, cut anywhere; by default one SSE event per write.
	LLMWriteHeader = "x-test-write-bytes"
	// LLMTextHeader: how many output tokens of text the answer carries
	// (default: all of them, UsageTokensHeader), so that an answer can
	// report a large usage without its text.
	LLMTextHeader = "x-test-text-tokens"
	// LLMPaceHeader: microseconds between two writes: the upstream
	// produces its answer at a model's pace, not all at once.
	LLMPaceHeader = "x-test-pace-us"
	// LLMMalformHeader: "garbage" (no JSON at all), "truncate" (the answer
	// stops mid-way, without its usage), "no-usage", or "enormous" (an SSE
	// event, or a JSON body, of LLMEnormousBytes, without usage).
	LLMMalformHeader = "x-test-malform"
)

// LLMEnormousBytes is the size of an "enormous" answer's big part: past the
// filter's default bound of one SSE event (4 MiB).
const LLMEnormousBytes = 6 << 20

// LLMToken is the text of one output token.
const LLMToken = "abcd"

// LLMUsage is what an LLM answer reported, in tokens.
type LLMUsage struct {
	Input, Cached, Output int64
}

// Total is every token of u.
func (u LLMUsage) Total() int64 { return u.Input + u.Cached + u.Output }

// llmAnswer is what a request asked the upstream to answer.
type llmAnswer struct {
	format  string
	sse     bool
	usage   LLMUsage
	text    int64 // output tokens of text
	write   int   // bytes per write, 0: one event per write
	pace    time.Duration
	malform string // "" or one of LLMMalformHeader's values
	hold    string // gate after the first write
}

// readLLMAnswer reads the request headers of an LLM answer.
func readLLMAnswer(r *http.Request) (llmAnswer, error) {
	a := llmAnswer{format: r.Header.Get(LLMFormatHeader), sse: r.Header.Get(LLMStreamHeader) == "1",
		malform: r.Header.Get(LLMMalformHeader), hold: r.Header.Get(UsageHoldHeader)}
	a.text = -1
	for _, f := range []struct {
		header string
		dst    *int64
	}{{UsageTokensHeader, &a.usage.Output}, {LLMInputHeader, &a.usage.Input}, {LLMCachedHeader, &a.usage.Cached}, {LLMTextHeader, &a.text}} {
		if v := r.Header.Get(f.header); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				return a, fmt.Errorf("%s must be a number >= 0", f.header)
			}
			*f.dst = n
		}
	}
	if a.text < 0 {
		a.text = a.usage.Output
	}
	if v := r.Header.Get(LLMPaceHeader); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return a, fmt.Errorf("%s must be a number >= 0", LLMPaceHeader)
		}
		a.pace = time.Duration(n) * time.Microsecond
	}
	if v := r.Header.Get(LLMWriteHeader); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return a, fmt.Errorf("%s must be a number >= 1", LLMWriteHeader)
		}
		a.write = n
	}
	switch a.format {
	case "openai_chat", "openai_responses", "anthropic":
	default:
		return a, fmt.Errorf("%s: unknown format %q", LLMFormatHeader, a.format)
	}
	return a, nil
}

// serveLLM answers r as an LLM API would, and counts the usage it reported
// for key (none when the answer is malformed or without usage).
func (u *UsageUpstream) serveLLM(w http.ResponseWriter, r *http.Request, key string) {
	a, err := readLLMAnswer(r)
	if err != nil {
		http.Error(w, "usage upstream: "+err.Error(), http.StatusBadRequest)
		return
	}
	parts := a.parts()
	ct := "application/json"
	if a.sse {
		ct = "text/event-stream"
	}
	w.Header().Set("Content-Type", ct)
	if a.reports() {
		// Also as a header, for Envoy's own path (a Lua filter copies it to
		// the dynamic metadata Envoy AI Gateway's rate limit reads).
		w.Header().Set(UsageReportHeader, strconv.FormatInt(a.usage.Total(), 10))
	}
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	first := true
	for _, p := range parts {
		for _, piece := range a.pieces(p) {
			if r.Context().Err() != nil {
				u.canceled.Add(1)
				return
			}
			if _, err := w.Write(piece); err != nil {
				u.canceled.Add(1)
				return
			}
			if err := rc.Flush(); err != nil {
				u.canceled.Add(1)
				return
			}
			if first && a.hold != "" {
				select {
				case <-u.gate(a.hold):
				case <-r.Context().Done():
				}
			}
			first = false
			if a.pace > 0 {
				time.Sleep(a.pace) // the model's pace
			}
		}
	}
	if a.reports() {
		u.reportUsage(key, a.usage)
	}
}

// reports says whether the answer carries its usage.
func (a *llmAnswer) reports() bool { return a.malform == "" }

// pieces cuts part p into the answer's writes.
func (a *llmAnswer) pieces(p []byte) [][]byte {
	if a.write == 0 {
		return [][]byte{p}
	}
	var out [][]byte
	for len(p) > 0 {
		n := min(a.write, len(p))
		out = append(out, p[:n])
		p = p[n:]
	}
	return out
}

// parts returns the answer's parts: the SSE events, or the JSON body in
// pieces.
func (a *llmAnswer) parts() [][]byte {
	text := strings.Repeat(LLMToken, int(a.text))
	switch {
	case a.malform == "garbage" && a.sse:
		return [][]byte{[]byte("data: {this is not json\n\n"), []byte("data: <html>\n\n")}
	case a.malform == "garbage":
		return [][]byte{[]byte("<html><body>502 Bad Gateway</body></html>")}
	case a.malform == "enormous" && a.sse:
		big := []byte("data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("z", LLMEnormousBytes) + "\"}}]}\n\n")
		return append(a.events(""), big)
	case a.malform == "enormous":
		body := []byte(`{"choices":[{"message":{"content":"` + strings.Repeat("z", LLMEnormousBytes) + `"}}]}`)
		var out [][]byte
		for len(body) > 0 { // the body in pieces of 64 KiB
			n := min(64<<10, len(body))
			out, body = append(out, body[:n]), body[n:]
		}
		return out
	case !a.sse:
		body := []byte(a.jsonBody(text))
		if a.malform == "truncate" {
			body = body[:len(body)*2/3]
		}
		return [][]byte{body}
	}
	events := a.events(LLMToken)
	if a.malform == "truncate" {
		// Cut in the middle of the last event but one: no usage, half an
		// event.
		last := events[len(events)-2]
		events = append(events[:len(events)-2], last[:len(last)/2])
	}
	return events
}

// usageJSON is the usage object in the answer's format.
func (a *llmAnswer) usageJSON() string {
	u := a.usage
	switch a.format {
	case "openai_chat":
		return fmt.Sprintf(`{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}`,
			u.Input+u.Cached, u.Output, u.Total(), u.Cached)
	case "openai_responses":
		return fmt.Sprintf(`{"input_tokens":%d,"input_tokens_details":{"cached_tokens":%d},"output_tokens":%d,"total_tokens":%d}`,
			u.Input+u.Cached, u.Cached, u.Output, u.Total())
	}
	return fmt.Sprintf(`{"input_tokens":%d,"cache_creation_input_tokens":0,"cache_read_input_tokens":%d,"output_tokens":%d}`,
		u.Input, u.Cached, u.Output)
}

// jsonBody is the answer as one JSON body with text.
func (a *llmAnswer) jsonBody(text string) string {
	usage := a.usageJSON()
	if a.malform == "no-usage" {
		usage = "null"
	}
	switch a.format {
	case "openai_chat":
		return `{"id":"chatcmpl-1","object":"chat.completion","model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"` +
			text + `"},"finish_reason":"stop"}],"usage":` + usage + `}`
	case "openai_responses":
		return `{"id":"resp_1","object":"response","status":"completed","output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"` +
			text + `"}]}],"usage":` + usage + `}`
	}
	return `{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"` +
		text + `"}],"stop_reason":"end_turn","usage":` + usage + `}`
}

// events is the answer as SSE events, one per output token of delta text.
func (a *llmAnswer) events(delta string) [][]byte {
	var out [][]byte
	add := func(s string) { out = append(out, []byte(s)) }
	n := int(a.text)
	if delta == "" {
		n = 0
	}
	usage := a.malform != "no-usage" && a.malform != "enormous"
	switch a.format {
	case "openai_chat":
		for range n {
			add(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","model":"gpt-4o","choices":[{"index":0,"delta":{"content":"` + delta + `"}}]}` + "\n\n")
		}
		if usage {
			add(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","model":"gpt-4o","choices":[],"usage":` + a.usageJSON() + "}\n\n")
		}
		add("data: [DONE]\n\n")
	case "openai_responses":
		seq := 0
		ev := func(typ, body string) {
			add("event: " + typ + "\ndata: {\"type\":\"" + typ + "\",\"sequence_number\":" + strconv.Itoa(seq) + body + "}\n\n")
			seq++
		}
		ev("response.created", `,"response":{"id":"resp_1","status":"in_progress"}`)
		for range n {
			ev("response.output_text.delta", `,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"`+delta+`"`)
		}
		if usage {
			ev("response.completed", `,"response":{"id":"resp_1","status":"completed","usage":`+a.usageJSON()+`}`)
		}
	default:
		start := a.usage
		start.Output = 1
		startUsage := fmt.Sprintf(`{"input_tokens":%d,"cache_creation_input_tokens":0,"cache_read_input_tokens":%d,"output_tokens":1}`, start.Input, start.Cached)
		add("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-sonnet-4-5\",\"content\":[],\"usage\":" + startUsage + "}}\n\n")
		add("event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n")
		for range n {
			add("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"" + delta + "\"}}\n\n")
		}
		add("event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n")
		if usage {
			add(fmt.Sprintf("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":%d}}\n\n", a.usage.Output))
		}
		add("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
	}
	return out
}
