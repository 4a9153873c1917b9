package llm

import (
	"strings"
	"testing"
)

func TestReadRequestFixtures(t *testing.T) {
	for _, tc := range []struct {
		file string
		want Request
	}{
		{"chat.json", Request{Model: "gpt-4o-mini", MaxOutput: 256, MaxOutputSet: true, Choices: 1, PromptBytes: 54, Stream: true, IncludeUsage: true}},
		// Text parts, tool call arguments and a tool's answer; the image
		// is not counted; tools count as their JSON (118 bytes).
		{"chat-tools.json", Request{Model: "gpt-4.1", MaxOutput: 100, MaxOutputSet: true, Choices: 2, PromptBytes: 41 + 118}},
		{"responses.json", Request{Model: "gpt-5", MaxOutput: 500, MaxOutputSet: true, Choices: 1, PromptBytes: 28, Stream: true}},
		// "caf\u00e9" counts é as its 2 UTF-8 bytes.
		{"responses-items.json", Request{Model: "o4-mini", Choices: 1, PromptBytes: 20}},
		// System blocks, a string content, a tool_result's nested text;
		// the tool_use input as its JSON (15 bytes); not the image.
		{"anthropic.json", Request{Model: "claude-sonnet-4-5", MaxOutput: 1024, MaxOutputSet: true, Choices: 1, PromptBytes: 15 + 15, Stream: true}},
		// A shape this package does not know: OK, nothing found.
		{"unknown.json", Request{Choices: 1}},
	} {
		body := fixture(t, "request/"+tc.file)
		for _, c := range chunkings(body) {
			r := NewRequestReader(int64(len(body)))
			for _, chunk := range c.chunks {
				r.Write(chunk)
			}
			if got := r.Result(); got != tc.want {
				t.Fatalf("%s, %s:\n got %+v\nwant %+v", tc.file, c.name, got, tc.want)
			}
		}
		if got := ReadRequest(body, int64(len(body))); got != tc.want {
			t.Errorf("%s: ReadRequest = %+v", tc.file, got)
		}
	}
}

func TestReadRequestStatus(t *testing.T) {
	for _, tc := range []struct {
		name string
		body string
		max  int64
		want RequestStatus
	}{
		{"fits exactly", `{"model":"m"}`, 13, RequestOK},
		{"one byte over", `{"model":"m"} `, 13, RequestTooLarge},
		{"empty", ``, 100, RequestMalformed},
		{"whitespace", " \n", 100, RequestMalformed},
		{"not JSON", `model=m`, 100, RequestMalformed},
		{"an array", `[{"model":"m"}]`, 100, RequestMalformed},
		{"truncated", `{"model":"m","messages":[{"content":"hi"`, 100, RequestMalformed},
		{"trailing garbage", `{"model":"m"} x`, 100, RequestMalformed},
		{"two objects", `{} {}`, 100, RequestMalformed},
		{"too deep", `{"messages":` + strings.Repeat("[", 70) + strings.Repeat("]", 70) + `}`, 1000, RequestMalformed},
	} {
		if got := ReadRequest([]byte(tc.body), tc.max).Status; got != tc.want {
			t.Errorf("%s: Status = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestRequestTooLargeIsNotRead(t *testing.T) {
	r := NewRequestReader(10)
	r.Write([]byte(`{"model":`))
	r.Write([]byte(`"m"}`))
	if got := r.Result(); got != (Request{Status: RequestTooLarge}) {
		t.Errorf("Result = %+v", got)
	}
	r.Reset(100) // the same reader, a new body
	r.Write([]byte(`{"model":"m"}`))
	if got := r.Result(); got.Status != RequestOK || got.Model != "m" {
		t.Errorf("after Reset: %+v", got)
	}
}

func TestRequestFields(t *testing.T) {
	for _, tc := range []struct {
		name string
		body string
		want Request
	}{
		{"largest maximum wins", `{"max_tokens":10,"max_completion_tokens":300,"max_output_tokens":20}`,
			Request{MaxOutput: 300, MaxOutputSet: true, Choices: 1}},
		{"invalid maximum is not given", `{"max_tokens":-5}`, Request{Choices: 1}},
		{"fractional maximum", `{"max_tokens":10.5}`, Request{Choices: 1}},
		{"string maximum", `{"max_tokens":"10"}`, Request{Choices: 1}},
		{"null maximum", `{"max_tokens":null}`, Request{Choices: 1}},
		{"zero maximum is given", `{"max_tokens":0}`, Request{MaxOutputSet: true, Choices: 1}},
		{"n 0 is 1", `{"n":0}`, Request{Choices: 1}},
		{"model not a string", `{"model":5}`, Request{Choices: 1}},
		{"model too long", `{"model":"` + strings.Repeat("m", MaxModelBytes+1) + `"}`, Request{Choices: 1}},
		{"model at the bound", `{"model":"` + strings.Repeat("m", MaxModelBytes) + `"}`, Request{Model: strings.Repeat("m", MaxModelBytes), Choices: 1}},
		{"escaped model", `{"model":"gpt\u002d4o"}`, Request{Model: "gpt-4o", Choices: 1}},
		{"stream false", `{"stream":false,"stream_options":{"include_usage":false}}`, Request{Choices: 1}},
		{"messages not an array", `{"messages":"hello"}`, Request{Choices: 1, PromptBytes: 5}},
		{"nested keys are not the top level's", `{"metadata":{"model":"x","max_tokens":5,"messages":[{"content":"abc"}]}}`, Request{Choices: 1}},
		{"escapes count decoded", `{"messages":[{"content":"a\nb\u00e9\ud83d\ude00"}]}`, Request{Choices: 1, PromptBytes: 1 + 1 + 1 + 2 + 4}},
		{"ids and types are not text", `{"messages":[{"role":"user","name":"bob","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral"}}]}]}`,
			Request{Choices: 1, PromptBytes: 2}},
		{"audio and files are not text", `{"messages":[{"content":[{"type":"input_audio","input_audio":{"data":"AAAA"}},{"type":"file","file":{"file_data":"BBBB"}}]}]}`,
			Request{Choices: 1}},
	} {
		got := ReadRequest([]byte(tc.body), 1<<20)
		tc.want.Status = RequestOK
		if got != tc.want {
			t.Errorf("%s:\n got %+v\nwant %+v", tc.name, got, tc.want)
		}
	}
}

func TestRequestReserve(t *testing.T) {
	q := Request{MaxOutput: 100, MaxOutputSet: true, Choices: 2, PromptBytes: 41}
	// ceil(41 / 4) = 11 prompt tokens, 2 x 100 output.
	if got := q.Reserve(DefaultRatio, 4096); got != 211 {
		t.Errorf("Reserve = %d, want 211", got)
	}
	if got := q.Usage(DefaultRatio, 4096); got != (Usage{Input: 11, Output: 200}) {
		t.Errorf("Usage = %+v", got)
	}
	q.MaxOutputSet = false // the caller's default applies
	if got := q.Reserve(Ratio(3500), 4096); got != 12+2*4096 {
		t.Errorf("Reserve with the default = %d, want %d", got, 12+2*4096)
	}
	q = Request{MaxOutput: MaxTokens, MaxOutputSet: true, Choices: 128, PromptBytes: 1 << 40}
	if got := q.Reserve(DefaultRatio, 0); got != MaxTokens {
		t.Errorf("Reserve = %d, want it saturated at %d", got, int64(MaxTokens))
	}
}

func TestRatio(t *testing.T) {
	for _, tc := range []struct {
		r    Ratio
		n    int64
		want int64
	}{
		{DefaultRatio, 0, 0}, {DefaultRatio, -5, 0}, {DefaultRatio, 1, 1}, {DefaultRatio, 4, 1}, {DefaultRatio, 5, 2},
		{0, 8, 2}, {Ratio(3500), 7, 2}, {Ratio(3500), 8, 3}, {Ratio(1), 3, 3000},
		{Ratio(1), MaxTokens, MaxTokens}, {DefaultRatio, 1<<63 - 1, MaxTokens},
	} {
		if got := tc.r.Tokens(tc.n); got != tc.want {
			t.Errorf("Ratio(%d).Tokens(%d) = %d, want %d", tc.r, tc.n, got, tc.want)
		}
	}
}

func TestRequestReaderAllocatesNothing(t *testing.T) {
	body := fixture(t, "request/anthropic.json")
	r := NewRequestReader(1 << 20)
	r.Write(body)
	_ = r.Result() // the model name is made once, then reused
	if n := testing.AllocsPerRun(100, func() {
		r.Reset(1 << 20)
		r.Write(body)
		_ = r.Result()
	}); n != 0 {
		t.Errorf("a request allocates %v times", n)
	}
}
