package stack

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"testing"

	"github.com/sluicehq/sluice/filter/core/llm"
)

// TestLLMUpstreamAnswers: every format the upstream answers in, JSON and
// SSE, in writes cut anywhere, reads with package llm as the usage it
// reported, and its stream's running count is its output (Anthropic's: one
// more, its message_start's count).
func TestLLMUpstreamAnswers(t *testing.T) {
	u, err := StartUsageUpstream("127.0.0.1:0", "x-api-key")
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close(context.Background())
	want := LLMUsage{Input: 31, Cached: 1024, Output: 57}
	for _, format := range []string{"openai_chat", "openai_responses", "anthropic"} {
		for _, sse := range []bool{false, true} {
			key := format + strconv.FormatBool(sse)
			req, _ := http.NewRequest("POST", "http://"+u.Addr()+"/v1", nil)
			req.Header.Set("x-api-key", key)
			req.Header.Set(LLMFormatHeader, format)
			req.Header.Set(UsageTokensHeader, "57")
			req.Header.Set(LLMInputHeader, "31")
			req.Header.Set(LLMCachedHeader, "1024")
			req.Header.Set(LLMWriteHeader, "13")
			if sse {
				req.Header.Set(LLMStreamHeader, "1")
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var res llm.Result
			var out int64
			if sse {
				r := llm.NewSSEReader(llm.StreamOptions{})
				r.Write(body)
				res, out = r.Result(), r.OutputTokens()
			} else {
				r := llm.NewJSONReader()
				r.Write(body)
				res, out = r.Result(), 57
			}
			got := LLMUsage{Input: res.Usage.Input, Cached: res.Usage.Cached, Output: res.Usage.Output}
			// Anthropic's message_start counts 1 output token before the
			// deltas: the running count ends one above until message_delta.
			if res.Status != llm.UsageComplete || got != want || out < 57 || out > 58 || u.ReportedUsage(key) != want {
				t.Fatalf("%s (sse %v): %+v %v, running count %d, reported %+v; want %+v\n%s", format, sse, got, res.Status, out, u.ReportedUsage(key), want, body)
			}
		}
	}
}
