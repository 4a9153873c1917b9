package llm

import (
	"encoding/json"
	"strings"
	"testing"
)

// The bodies of the benchmarks, made here so that their sizes are exact:
// a chat completions request of a given size, and 200-event answers of
// OpenAI chat (with include_usage) and Anthropic, one event per chunk (as
// Envoy often delivers a stream that a provider flushes event by event).

var words = strings.Fields("the river runs north past the old mill and under three stone bridges before it reaches the sea " +
	"where ships wait for the tide while gulls circle over the harbour and the town wakes slowly")

// sentence is n words of text, starting at word i.
func sentence(i, n int) string {
	var sb strings.Builder
	for k := 0; k < n; k++ {
		if k > 0 {
			sb.WriteByte(' ')
		}
		sb.WriteString(words[(i+k)%len(words)])
	}
	return sb.String()
}

// chatRequest is a chat completions request of about size bytes: a system
// message and turns of 40 words until the size is reached.
func chatRequest(size int) []byte {
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	req := struct {
		Model     string         `json:"model"`
		Messages  []msg          `json:"messages"`
		MaxTokens int            `json:"max_completion_tokens"`
		Stream    bool           `json:"stream"`
		Options   map[string]any `json:"stream_options"`
	}{Model: "gpt-4o-mini", MaxTokens: 1024, Stream: true, Options: map[string]any{"include_usage": true},
		Messages: []msg{{"system", "You are a helpful assistant. Answer briefly."}}}
	for i := 0; ; i++ {
		b, _ := json.Marshal(req)
		if len(b) >= size {
			return b[:len(b):len(b)]
		}
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		n := 40
		if rest := (size - len(b) - 40) / 6; rest < n {
			n = max(1, rest)
		}
		req.Messages = append(req.Messages, msg{role, sentence(i, n)})
	}
}

// chatStream is an OpenAI chat stream of n events: n-2 content deltas of
// one or two words, a usage chunk, [DONE].
func chatStream(n int) [][]byte {
	const head = `data: {"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion.chunk","created":1767225600,` +
		`"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_0ba0d124f1","choices":[`
	events := make([][]byte, 0, n)
	for i := 0; i < n-2; i++ {
		events = append(events, []byte(head+`{"index":0,"delta":{"content":"`+sentence(i, 1+i%2)+` "},"logprobs":null,"finish_reason":null}],"usage":null}`+"\n\n"))
	}
	events = append(events, []byte(head+`],"usage":{"prompt_tokens":1017,"completion_tokens":297,"total_tokens":1314,`+
		`"prompt_tokens_details":{"cached_tokens":768,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,`+
		`"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}}`+"\n\n"),
		[]byte("data: [DONE]\n\n"))
	return events
}

// anthropicStream is an Anthropic stream of n events.
func anthropicStream(n int) [][]byte {
	events := [][]byte{
		[]byte(`event: message_start` + "\n" + `data: {"type":"message_start","message":{"id":"msg_01XFDUDYJgAACzvnptvVoYEL",` +
			`"type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5-20250929","stop_reason":null,` +
			`"stop_sequence":null,"usage":{"input_tokens":1017,"cache_creation_input_tokens":0,"cache_read_input_tokens":768,"output_tokens":1}}}` + "\n\n"),
		[]byte(`event: content_block_start` + "\n" + `data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}` + "\n\n"),
	}
	for i := 0; i < n-5; i++ {
		events = append(events, []byte(`event: content_block_delta`+"\n"+`data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"`+
			sentence(i, 1+i%2)+` "}}`+"\n\n"))
	}
	return append(events,
		[]byte(`event: content_block_stop`+"\n"+`data: {"type":"content_block_stop","index":0}`+"\n\n"),
		[]byte(`event: message_delta`+"\n"+`data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":297}}`+"\n\n"),
		[]byte(`event: message_stop`+"\n"+`data: {"type":"message_stop"}`+"\n\n"))
}

func benchmarkRequest(b *testing.B, size int) {
	body := chatRequest(size)
	r := NewRequestReader(1 << 20)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		r.Reset(1 << 20)
		r.Write(body)
		if q := r.Result(); q.Status != RequestOK || q.PromptBytes < int64(size)/2 {
			b.Fatalf("%+v", q)
		}
	}
}

func BenchmarkRequest4KiB(b *testing.B)  { benchmarkRequest(b, 4<<10) }
func BenchmarkRequest64KiB(b *testing.B) { benchmarkRequest(b, 64<<10) }

func benchmarkStream(b *testing.B, events [][]byte, output int64) {
	n := 0
	for _, e := range events {
		n += len(e)
	}
	r := NewSSEReader(StreamOptions{})
	b.SetBytes(int64(n))
	b.ReportAllocs()
	b.ReportMetric(float64(len(events)), "events/op")
	for b.Loop() {
		r.Reset(StreamOptions{})
		for _, e := range events {
			r.Write(e)
			_ = r.OutputTokens()
		}
		if res := r.Result(); res.Status != UsageComplete || res.Usage.Output != output {
			b.Fatalf("%+v", res)
		}
	}
}

func BenchmarkStreamChat200(b *testing.B)      { benchmarkStream(b, chatStream(200), 297) }
func BenchmarkStreamAnthropic200(b *testing.B) { benchmarkStream(b, anthropicStream(200), 297) }

func BenchmarkJSONAnswer(b *testing.B) {
	body := []byte(`{"id":"chatcmpl-x","object":"chat.completion","created":1767225600,"model":"gpt-4o-mini-2024-07-18",` +
		`"choices":[{"index":0,"message":{"role":"assistant","content":"` + sentence(0, 300) + `","refusal":null},"finish_reason":"stop"}],` +
		`"usage":{"prompt_tokens":1017,"completion_tokens":297,"total_tokens":1314,"prompt_tokens_details":{"cached_tokens":768}}}`)
	r := NewJSONReader()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		r.Reset()
		r.Write(body)
		if res := r.Result(); res.Status != UsageComplete {
			b.Fatalf("%+v", res)
		}
	}
}

func TestBenchmarkBodies(t *testing.T) {
	for _, size := range []int{4 << 10, 64 << 10} {
		if n := len(chatRequest(size)); n < size || n > size+300 {
			t.Errorf("chatRequest(%d) is %d bytes", size, n)
		}
	}
	for name, events := range map[string][][]byte{"chat": chatStream(200), "anthropic": anthropicStream(200)} {
		if len(events) != 200 {
			t.Errorf("%s: %d events", name, len(events))
		}
		var all []byte
		for _, e := range events {
			all = append(all, e...)
		}
		if got, _ := refSSE(all); got.Status != UsageComplete || got.Stats.Events != 200 || got.Stats.Malformed != 0 {
			t.Errorf("%s stream: %+v", name, got)
		}
	}
}
