package core

import (
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/filter/core/llm"
	"github.com/sluicehq/sluice/filter/core/rlsproto"
)

// llmConfig is a configuration with one usage-based rate limit per API key
// with usage object usage, the llm object llmObj, and settlements sent at
// stream end one per call.
func llmConfig(usage, llmObj string) string {
	return `{"cluster": "cp", "domain": "llm", "timeout": "25ms",
	  "rate_limits": [{"actions": [{"request_headers": {"header_name": "x-api-key", "descriptor_key": "api_key"}}],
	    "usage": ` + usage + `}],
	  "settle": {"batch_max": 1, "interval_ms": 0}, "llm": ` + llmObj + `}`
}

// twoModels is a weight table of two models and a default, in micro-dollars
// per million tokens.
const twoModels = `{"weights": [
	{"model": "gpt-4o*", "input": 2500000, "output": 10000000, "cached": 1250000},
	{"model": "claude-sonnet-4-5*", "input": 3000000, "output": 15000000, "cached": 300000, "cache_write": 3750000},
	{"model": "*", "input": 5000000, "output": 20000000, "cached": 5000000}]}`

// callCost returns the hits_addend of descriptor 0 of the last call.
func (b *testbed) callCost() uint64 {
	b.t.Helper()
	req := sentRequest(b.t, b.lastCall().body)
	if h := req.Descriptors[0].GetHitsAddend(); h != nil {
		return h.GetValue()
	}
	return uint64(req.HitsAddend)
}

// post opens a stream for API key with a request body that arrives in
// pieces of step bytes, and returns it with the action of its last hook.
func (b *testbed) post(key, body string, step int) (uint32, Action) {
	b.t.Helper()
	b.next++
	id := b.next
	b.host.headers[id] = map[string]string{":method": "POST", ":path": "/v1/chat/completions", "x-api-key": key}
	b.host.noBody[id] = body == ""
	x := b.open(id)
	a := b.requestHeaders(id)
	if body == "" {
		return id, a
	}
	if a != Pause || len(b.host.calls) != 0 && b.lastCall().stream == id {
		b.t.Fatalf("a request whose body sizes its reserve was decided before its body: action %d", a)
	}
	for n := min(step, len(body)); ; n = min(n+step, len(body)) {
		b.host.reqBody[id] = []byte(body[:n])
		a = b.w.RequestBody(x, n, n == len(body))
		if n == len(body) || a != Pause || x.state != stateBody {
			return id, a
		}
	}
}

// chatBody is a chat completions request: a prompt of promptBytes bytes
// and, if maxTokens >= 0, its max_tokens.
func chatBody(model string, promptBytes, maxTokens int) string {
	b := `{"model":"` + model + `","messages":[{"role":"user","content":"` + strings.Repeat("a", promptBytes) + `"}]`
	if maxTokens >= 0 {
		b += `,"max_tokens":` + strconv.Itoa(maxTokens)
	}
	return b + `,"stream":true}`
}

// TestReserveFromRequestBody: the request waits for its body, then asks
// the prompt's estimate plus the maximum output (tokens, or weighted with
// the model's weights); a body past the bound, one that is not JSON, and
// none at all get the rate limit's reserve, the first two counted.
func TestReserveFromRequestBody(t *testing.T) {
	tokens := llmConfig(`{"reserve": 77, "reserve_from_request": true, "source": {"llm_usage": {}}}`,
		`{"max_request_bytes": 2000, "default_max_output": 300}`)
	weighted := llmConfig(`{"reserve": 77, "reserve_from_request": true, "source": {"llm_usage": {}}, "cost": "weighted"}`, twoModels)
	for _, tt := range []struct {
		name, config, body string
		step               int
		want               uint64
		counter            string
	}{
		// 400 bytes of prompt: 100 tokens at 4 bytes a token.
		{"tokens", tokens, chatBody("gpt-4o", 400, 1000), 64, 1100, ""},
		{"one piece", tokens, chatBody("gpt-4o", 400, 1000), 1 << 20, 1100, ""},
		{"default max output", tokens, chatBody("gpt-4o", 400, -1), 100, 400, ""},
		{"too large", tokens, chatBody("gpt-4o", 4000, 10), 1000, 77, MetricLLMRequestTooLarge},
		{"not JSON", tokens, "model=gpt-4o&max_tokens=10", 5, 77, MetricLLMRequestMalformed},
		{"no body", tokens, "", 0, 77, ""},
		// gpt-4o: 100 input tokens at $2.50/M and 1000 output at $10/M:
		// 250 + 10000 micro-dollars.
		{"weighted", weighted, chatBody("gpt-4o-2024-08-06", 400, 1000), 64, 10250, ""},
		{"weighted default row", weighted, chatBody("o9", 400, 1000), 64, 20500, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := newTestbed(t, tt.config)
			id, a := b.post("k1", tt.body, tt.step)
			if a != Pause || len(b.host.calls) != 1 || b.lastCall().stream != id {
				t.Fatalf("action %d, %d calls: want the request decided by a call", a, len(b.host.calls))
			}
			if got := b.callCost(); got != tt.want {
				t.Fatalf("reserve %d, want %d", got, tt.want)
			}
			for _, m := range []string{MetricLLMRequestTooLarge, MetricLLMRequestMalformed} {
				if want := int64(0); m == tt.counter {
					want = 1
					if b.host.counters[m] != want {
						t.Fatalf("%s %d, want 1", m, b.host.counters[m])
					}
				} else if b.host.counters[m] != 0 {
					t.Fatalf("%s %d, want 0", m, b.host.counters[m])
				}
			}
			b.deliver(okFor(t, 1))
			if b.host.resumed[id] != 1 {
				t.Fatalf("not resumed")
			}
			b.end(id)
			if n := b.w.tokens.pool.Live(); n != 0 {
				t.Fatalf("%d meters left after the stream", n)
			}
		})
	}
}

// TestRequestBodyWaitsWithItsHeaders: while a request is undecided, its
// body waits with it (Pause: the host buffers it), whatever the
// configuration; once decided, it goes on.
func TestRequestBodyWaitsWithItsHeaders(t *testing.T) {
	b := newTestbed(t, testConfig)
	id, a := b.request(apiRequest, "10.0.0.1:1")
	if a != Pause {
		t.Fatalf("action %d", a)
	}
	x := b.streams[id]
	if got := b.w.RequestBody(x, 10, false); got != Pause {
		t.Fatalf("a body chunk of an undecided request: %d, want Pause", got)
	}
	b.deliver(okFor(t, 2))
	if got := b.w.RequestBody(x, 20, true); got != Continue {
		t.Fatalf("a body chunk of an admitted request: %d, want Continue", got)
	}
}

// sse returns an SSE stream of n chat chunks of text each, then, if
// usage, the final usage chunk (prompt, completion), and [DONE].
func sse(n int, text string, usage bool, prompt, completion int) string {
	var b strings.Builder
	for range n {
		b.WriteString(`data: {"choices":[{"delta":{"content":"` + text + `"}}]}` + "\n\n")
	}
	if usage {
		b.WriteString(`data: {"choices":[],"usage":{"prompt_tokens":` + strconv.Itoa(prompt) + `,"completion_tokens":` + strconv.Itoa(completion) + "}}\n\n")
	}
	b.WriteString("data: [DONE]\n\n")
	return b.String()
}

// answer runs stream id's response: headers with content type ct, then
// body in chunks of step bytes, then its end. It returns what the client
// got of the body.
func (b *testbed) answer(id uint32, ct, body string, step int) string {
	b.host.respHeaders[id] = map[string]string{":status": "200", "content-type": ct}
	b.responseHeaders(id, false)
	var client strings.Builder
	for start := 0; start < len(body); start += step {
		end := min(start+step, len(body))
		b.host.chunk[id] = []byte(body[start:end])
		b.responseBody(id, end-start, end == len(body))
		client.Write(b.host.chunk[id])
		if b.host.endedEarly[id] {
			break
		}
	}
	b.end(id)
	return client.String()
}

// TestUsageFromTheAnswer: the usage object of a JSON answer, or of an SSE
// stream's last events, is what the stream costs; the difference with the
// reserve is charged, or refunded (is_negative_hits), exactly.
func TestUsageFromTheAnswer(t *testing.T) {
	for _, tt := range []struct {
		name, ct, body string
		want           int64 // the settlement: charge > 0, refund < 0
	}{
		{"json refund", "application/json", `{"id":"x","usage":{"prompt_tokens":90,"completion_tokens":200}}`, 290 - 1100},
		{"json charge", "application/json", `{"usage":{"prompt_tokens":900,"completion_tokens":1000}}`, 1900 - 1100},
		{"anthropic json", "application/json", `{"usage":{"input_tokens":5,"cache_read_input_tokens":1000,"output_tokens":95}}`, 0}, // 1,100: the reserve
		{"sse refund", "text/event-stream", sse(20, "word ", true, 100, 20), 120 - 1100},
		{"sse charge", "text/event-stream; charset=utf-8", sse(3, "x", true, 100, 1500), 1600 - 1100},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := newTestbed(t, llmConfig(`{"reserve": 77, "reserve_from_request": true, "source": {"llm_usage": {}}}`, `{}`))
			id, _ := b.post("k1", chatBody("gpt-4o", 400, 1000), 1<<20)
			b.deliver(okFor(t, 1))
			if got := b.answer(id, tt.ct, tt.body, 7); got != tt.body {
				t.Fatalf("the client got %q, want the answer untouched", got)
			}
			calls := settleCalls(t, b.host)
			if tt.want == 0 && len(calls) != 0 || tt.want != 0 && (len(calls) != 1 || calls[0].charges[0] != tt.want) {
				t.Fatalf("settle calls %+v, want %d", calls, tt.want)
			}
			if n := b.host.counters[MetricUsageRefunds]; (tt.want < 0) != (n == 1) {
				t.Fatalf("usage_refunds %d", n)
			}
			if b.w.tokens.pool.Live() != 0 {
				t.Fatal("a meter is left")
			}
		})
	}
}

// TestUsageMalformedAnswers: a JSON answer that is not JSON, truncated, or
// enormous and without usage, and an SSE stream without usage, are
// counted and charged per missing; the answer is never held.
func TestUsageMalformedAnswers(t *testing.T) {
	huge := `{"choices":[{"message":{"content":"` + strings.Repeat("z", 3<<20) + `"}}]}`
	for _, tt := range []struct {
		name, ct, body string
		malformed      int64
	}{
		{"not json", "application/json", "<html>bad gateway</html>", 1},
		{"truncated", "application/json", `{"usage":{"prompt_tokens":90,"completion_tok`, 1},
		{"enormous without usage", "application/json", huge, 0},
		{"sse without usage", "text/event-stream", sse(5, "abc", false, 0, 0), 0},
		{"sse malformed events", "text/event-stream", "data: {nope\n\ndata: {\"choices\":[]}\n\n", 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := newTestbed(t, llmConfig(`{"reserve": 50, "source": {"llm_usage": {}}, "missing": 10}`, `{}`))
			id := b.admit("k1", nil)
			if got := b.answer(id, tt.ct, tt.body, 16<<10); got != tt.body {
				t.Fatal("the answer was changed")
			}
			calls := settleCalls(t, b.host)
			if len(calls) != 1 || calls[0].charges[0] != 10-50 {
				t.Fatalf("settle calls %+v, want the missing cost 10 settled against the reserve 50", calls)
			}
			if b.host.counters[MetricUsageMissing] != 1 || b.host.counters[MetricLLMAnswerMalformed] != tt.malformed {
				t.Fatalf("counters %v", b.host.counters)
			}
		})
	}
}

// TestRefundLapsesAfterItsWindow: a refund is sent only within the window
// its reserve was taken in (duration_until_reset of the admission).
func TestRefundLapsesAfterItsWindow(t *testing.T) {
	b := newTestbed(t, llmConfig(`{"reserve": 500, "source": {"llm_usage": {}}}`, `{}`))
	admitted := func() uint32 {
		id, _ := b.request(map[string]string{":path": "/v1/chat/completions", "x-api-key": "k1"}, "")
		resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
			{Code: rlsv3.RateLimitResponse_OK, DurationUntilReset: durationpb.New(10 * time.Second)}}}
		b.deliver(grpcOK(t, resp))
		return id
	}
	doc := `{"usage":{"prompt_tokens":10,"completion_tokens":90}}`
	id := admitted()
	b.host.now += int64(9 * time.Second)
	b.answer(id, "application/json", doc, 100)
	if calls := settleCalls(t, b.host); len(calls) != 1 || calls[0].charges[0] != -400 {
		t.Fatalf("within the window: %+v, want a refund of 400", calls)
	}
	id = admitted()
	b.host.now += int64(11 * time.Second)
	b.answer(id, "application/json", doc, 100)
	if calls := settleCalls(t, b.host); len(calls) != 1 || b.host.counters[MetricUsageRefundsLapsed] != 1 {
		t.Fatalf("past the window: %d settle calls, %d lapsed; want no refund", len(calls), b.host.counters[MetricUsageRefundsLapsed])
	}
}

// TestRefundUnblocksTheKey: a settlement's refund that leaves something
// ends the key's block, in this worker and in the others of the proxy
// (their next request is not refused on it), and gives the local bucket
// back what the reserve took.
func TestRefundUnblocksTheKey(t *testing.T) {
	d := newSharedData()
	cfg := llmConfig(`{"reserve": 500, "source": {"llm_usage": {}}}`, `{}`)
	a, other := newTestbedOn(t, cfg, d), newTestbedOn(t, cfg, d)
	id := a.admit("k1", nil)
	// Another request is refused: the key is over its limit; both workers
	// then reject it locally.
	a.request(map[string]string{":path": "/v1/chat/completions", "x-api-key": "k1"}, "")
	a.deliver(overLimitOne(t))
	if _, act := a.request(map[string]string{":path": "/", "x-api-key": "k1"}, ""); act != Pause || a.host.counters[MetricPrecheckRejected] != 1 {
		t.Fatal("not blocked in its worker")
	}
	other.host.now = a.host.now
	if _, act := other.request(map[string]string{":path": "/", "x-api-key": "k1"}, ""); act != Pause || other.host.counters[MetricPrecheckRejected] != 1 {
		t.Fatal("not blocked in the other worker")
	}
	// The admitted stream used 100 of its 500: the refund frees the key.
	a.answer(id, "application/json", `{"usage":{"prompt_tokens":10,"completion_tokens":90}}`, 100)
	calls := settleCalls(t, a.host)
	if len(calls) != 1 || calls[0].charges[0] != -400 {
		t.Fatalf("settle calls %+v", calls)
	}
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
		{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: 400, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 1000, Unit: rlsv3.RateLimitResponse_RateLimit_DAY}}}}
	a.answerCall(calls[0].id, grpcOK(t, resp))
	calls0 := len(a.host.calls)
	if _, act := a.request(map[string]string{":path": "/", "x-api-key": "k1"}, ""); act != Pause || len(a.host.calls) != calls0+1 {
		t.Fatalf("still rejected in its worker after the refund freed the key (%d rejections)", a.host.counters[MetricPrecheckRejected])
	}
	other.host.now = a.host.now + 3e6 // past the freed mark's refresh
	if _, act := other.request(map[string]string{":path": "/", "x-api-key": "k1"}, ""); act != Pause || len(other.host.calls) != 1 {
		t.Fatalf("still rejected in the other worker (%d rejections, %d calls)", other.host.counters[MetricPrecheckRejected], len(other.host.calls))
	}
}

// overLimitOne is the control plane's answer refusing one descriptor (a
// draw, a request) for an hour.
func overLimitOne(t testing.TB) *fakeAnswer {
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
		{Code: rlsv3.RateLimitResponse_OVER_LIMIT, DurationUntilReset: durationpb.New(time.Hour),
			CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 1000, Unit: rlsv3.RateLimitResponse_RateLimit_DAY}}}}
	return grpcOK(t, resp)
}

// TestCutStream: a stream that may be cut draws slices past its reserve;
// once a draw is refused it runs at most one slice past what it was
// granted, then the client gets the cut event and the answer ends (on a
// host that can end it early; else every later chunk is emptied). Its
// settlement is what it produced, counted, and nothing of it is left.
func TestCutStream(t *testing.T) {
	for _, canEnd := range []bool{true, false} {
		t.Run("end early "+strconv.FormatBool(canEnd), func(t *testing.T) {
			b := newTestbed(t, llmConfig(`{"reserve": 10, "reserve_from_request": true, "source": {"llm_usage": {}}, "cut": {"slice": 100}}`,
				`{"default_max_output": 0}`))
			b.host.canEnd = canEnd
			// A prompt of 40 bytes: 10 tokens, the reserve.
			id, _ := b.post("k1", chatBody("gpt-4o", 40, -1), 1<<20)
			if b.callCost() != 10 {
				t.Fatalf("reserve %d", b.callCost())
			}
			b.deliver(okFor(t, 1))
			// 1000 events of 4 bytes (a token) each, usage at the end.
			body := sse(1000, "abcd", true, 10, 1000)
			b.host.respHeaders[id] = map[string]string{"content-type": "text/event-stream"}
			b.responseHeaders(id, false)
			var client strings.Builder
			draws := 0
			for start := 0; start < len(body); start += 300 {
				end := min(start+300, len(body))
				b.host.chunk[id] = []byte(body[start:end])
				b.responseBody(id, end-start, end == len(body))
				client.Write(b.host.chunk[id])
				// Answer each draw: the first two granted, then refused.
				for c := b.lastCall(); c.stream == 0 && !isSettle(c) && draws < 3 && len(b.host.calls) > draws+1; c = b.lastCall() {
					draws++
					if draws <= 2 {
						b.deliver(okFor(t, 1))
					} else {
						b.deliver(overLimitOne(t))
					}
				}
				if b.host.endedEarly[id] {
					break
				}
			}
			b.end(id)
			got := client.String()
			events := strings.Count(got, `"content":"abcd"`)
			// Granted 10 + 2 x 100; cost = 10 (prompt) + output: at most
			// granted + one slice, 310, so at most 300 events.
			if events > 300 || events < 200 || !strings.HasSuffix(got, string(llm.AppendCutEvent(nil, llm.OpenAIChat, "", 0)[:0])+"}}\n\n") ||
				!strings.Contains(got, `"code":"rate_limit_exceeded"`) || strings.Contains(got, "[DONE]") {
				t.Fatalf("the client got %d events, ending %q", events, got[max(0, len(got)-200):])
			}
			if b.host.counters[MetricLLMCuts] != 1 || b.host.counters[MetricLLMDraws] != 2 || b.host.counters[MetricLLMDrawsRefused] != 1 {
				t.Fatalf("counters %v", b.host.counters)
			}
			calls := settleCalls(t, b.host)
			// Counted: the prompt, the events sent, the one refused and
			// the rest of its chunk (the upstream produced them); or, when
			// the rest of the answer was read, its own usage.
			lo, hi := int64(10+events+1-210), int64(10+events+1+300/len(`data: {"choices":[{"delta":{"content":"abcd"}}]}`)-210)
			if !canEnd {
				lo, hi = 1010-210, 1010-210
			}
			if len(calls) != 1 || calls[0].charges[0] < lo || calls[0].charges[0] > hi {
				t.Fatalf("settle calls %+v, want %d..%d", calls, lo, hi)
			}
			if b.w.tokens.pool.Live() != 0 || len(b.w.exchanges.free) == 0 {
				t.Fatalf("%d meters left, %d exchanges free", b.w.tokens.pool.Live(), len(b.w.exchanges.free))
			}
		})
	}
}

// isSettle reports whether c is a settle call.
func isSettle(c fakeCall) bool {
	_, ok := header(c.headers, rlsproto.SettleHeader)
	return ok
}

// TestBodyNeverComes: a request whose body does not come within 5s is
// decided then with the rate limit's reserve (and resumed when admitted);
// a worker that never saw a body says what the host misses.
func TestBodyNeverComes(t *testing.T) {
	b := newTestbed(t, llmConfig(`{"reserve": 77, "reserve_from_request": true, "source": {"llm_usage": {}}}`, `{}`))
	b.next++
	id := b.next
	b.host.headers[id] = map[string]string{":path": "/v1/chat/completions", "x-api-key": "k1"}
	b.open(id)
	if a := b.requestHeaders(id); a != Pause || len(b.host.calls) != 0 {
		t.Fatalf("action %d", a)
	}
	b.host.now += int64(4 * time.Second)
	b.runTick()
	if len(b.host.calls) != 0 {
		t.Fatal("decided before the body's wait was over")
	}
	b.host.now += int64(time.Second)
	b.runTick()
	if len(b.host.calls) != 1 || b.callCost() != 77 || !b.host.logged("allow_on_headers_stop_iteration") {
		t.Fatalf("%d calls, logs %v", len(b.host.calls), b.host.logs)
	}
	b.deliver(okFor(t, 1))
	if b.host.resumed[id] != 1 {
		t.Fatal("not resumed")
	}
	b.end(id)
	if b.w.tokens.pool.Live() != 0 || len(b.w.tokens.bodies) != 0 {
		t.Fatal("state left behind")
	}
}
