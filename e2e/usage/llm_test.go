package usage

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/e2e/stack"
)

// LLM traffic through real Envoy: reserves sized from the request body,
// usage read from the answers (OpenAI's and Anthropic's shapes, JSON and
// SSE), charges and refunds settled exactly, streams cut at zero, and the
// docs' monthly budget in dollars run as written (llm_docs_test.go).

// Limits of llmPolicy (tokens a day).
const (
	llmExactLimit = 1_000_000_000 // llm_exact: never reached, a probe tells the charged total
	llmBoundLimit = 20_000        // llm_bound, llm_zero: the overshoot runs
	llmCutLimit   = 1000          // llm_cut
	llmBadLimit   = 1_000_000_000 // llm_bad
)

var llmPolicy = fmt.Sprintf(`
domain: usage
descriptors:
  - key: llm_exact
    rate_limit: {algorithm: fixed_window, unit: day, requests_per_unit: %d}
  - key: llm_bound
    rate_limit: {name: bound, algorithm: fixed_window, unit: day, requests_per_unit: %d}
  - key: llm_zero
    rate_limit: {name: zero, algorithm: fixed_window, unit: day, requests_per_unit: %d}
  - key: llm_cut
    rate_limit: {name: cut, algorithm: fixed_window, unit: day, requests_per_unit: %d}
  - key: llm_bad
    rate_limit: {algorithm: fixed_window, unit: day, requests_per_unit: %d}
`, llmExactLimit, llmBoundLimit, llmBoundLimit, llmCutLimit, llmBadLimit)

// Listeners of the LLM stack.
const (
	lnLLMExact = "llm-exact" // llm_exact: reserve from the request, usage from the answer (Redis)
	lnLLMBound = "llm-bound" // llm_bound: the same
	lnLLMZero  = "llm-zero"  // llm_zero: reserve 0, usage from the answer
	lnLLMCut   = "llm-cut"   // llm_cut: reserve from the request, cut with slices of llmSlice
	lnLLMBad   = "llm-bad"   // llm_bad: reserve 50, missing 7
	lnDocs     = "llm-docs"  // docs/llm.md's plugin configuration, as written
)

const (
	llmSlice      = 100
	llmBadReserve = 50
	llmBadMissing = 7
)

// fromLLM is the usage source of the LLM listeners.
var fromLLM = stack.M{"llm_usage": stack.M{}}

// llmPlugin is the filter configuration of one LLM rate limit on key.
func llmPlugin(key string, u stack.Usage) []byte { return usagePlugin(cpRedis, key, u).JSON() }

// llmListeners returns the LLM stack's listeners, with filter f.
func llmListeners(docsPlugin []byte) func(f stack.Filter) []stack.M {
	return func(f stack.Filter) []stack.M {
		ln := func(name string, plugin []byte) stack.M {
			return stack.HTTPListener(name, 0, []stack.M{stack.VirtualHost("all", route())}, f.HTTPFilterReadingBodies("sluice-"+name, plugin))
		}
		fromRequest := stack.Usage{Reserve: stack.Int(0), Source: fromLLM, ReserveFromRequest: true}
		cut := fromRequest
		cut.Cut = stack.M{"slice": llmSlice}
		return []stack.M{
			ln(lnLLMExact, llmPlugin("llm_exact", fromRequest)),
			ln(lnLLMBound, llmPlugin("llm_bound", fromRequest)),
			ln(lnLLMZero, llmPlugin("llm_zero", stack.Usage{Reserve: stack.Int(0), Source: fromLLM})),
			ln(lnLLMCut, llmPlugin("llm_cut", cut)),
			ln(lnLLMBad, llmPlugin("llm_bad", stack.Usage{Reserve: stack.Int(llmBadReserve), Source: fromLLM, Missing: llmBadMissing})),
			ln(lnDocs, docsPlugin),
		}
	}
}

// TestLLMEnvoy runs the LLM scenarios on one stack per filter host.
func TestLLMEnvoy(t *testing.T) {
	docsPolicy, docsPlugin := docsExample(t)
	stack.ForEachFilter(t, filters, func(t *testing.T, f stack.Filter) {
		if untilMidnight(time.Now()) < 10*time.Minute {
			t.Skip("within 10 minutes of UTC midnight: the day windows would reset mid-test")
		}
		e := startStack(t, f, spec{
			policies:  map[string]string{"usage.yaml": llmPolicy, "docs.yaml": docsPolicy},
			listeners: llmListeners(docsPlugin),
			aliases:   map[string]string{docsCluster: cpRedis},
		})
		t.Run("exact", func(t *testing.T) { testLLMExact(t, e) })
		t.Run("overshoot", func(t *testing.T) { testLLMOvershoot(t, e) })
		t.Run("cut", func(t *testing.T) { testLLMCut(t, e) })
		t.Run("malformed", func(t *testing.T) { testLLMMalformed(t, e) })
		t.Run("docs", func(t *testing.T) { testLLMDocs(t, e) })
	})
}

// llmRequest is one request to an LLM listener, and what its answer reports.
type llmRequest struct {
	key, format string
	model       string
	sse         bool
	promptBytes int // the prompt's text
	maxTokens   int // -1: none
	usage       stack.LLMUsage
	textTokens  int    // -1: as many as usage.Output
	write       int    // bytes per write (0: an event per write)
	paceUs      int    // microseconds between writes
	malform     string // stack.LLMMalformHeader's value
	hold        string
}

// reserve is the reserve the filter sizes for r at 4 bytes a token (tokens).
func (r llmRequest) reserve() int64 {
	return int64((r.promptBytes+3)/4 + max(r.maxTokens, 0))
}

// body is r's request body in its API's shape.
func (r llmRequest) body() string {
	prompt := strings.Repeat("p", r.promptBytes)
	max := ""
	if r.maxTokens >= 0 {
		max = `,"max_tokens":` + strconv.Itoa(r.maxTokens)
	}
	switch r.format {
	case "openai_responses":
		max = strings.Replace(max, "max_tokens", "max_output_tokens", 1)
		return `{"model":"` + r.model + `","input":"` + prompt + `"` + max + `,"stream":` + strconv.FormatBool(r.sse) + `}`
	case "anthropic":
		return `{"model":"` + r.model + `","messages":[{"role":"user","content":"` + prompt + `"}]` + max + `,"stream":` + strconv.FormatBool(r.sse) + `}`
	}
	return `{"model":"` + r.model + `","messages":[{"role":"user","content":"` + prompt + `"}]` + max +
		`,"stream":` + strconv.FormatBool(r.sse) + `,"stream_options":{"include_usage":true}}`
}

// path is r's API's path.
func (r llmRequest) path() string {
	switch r.format {
	case "openai_responses":
		return "/v1/responses"
	case "anthropic":
		return "/v1/messages"
	}
	return "/v1/chat/completions"
}

// newLLMRequest returns the HTTP request r to listener ln.
func (e *env) newLLMRequest(ctx context.Context, ln string, r llmRequest) *http.Request {
	req, err := http.NewRequestWithContext(ctx, "POST", e.envoy.URL(ln)+r.path(), strings.NewReader(r.body()))
	if err != nil {
		panic(err)
	}
	h := req.Header
	h.Set("content-type", "application/json")
	h.Set(keyHeader, r.key)
	h.Set(stack.LLMFormatHeader, r.format)
	h.Set(stack.UsageTokensHeader, strconv.FormatInt(r.usage.Output, 10))
	h.Set(stack.LLMInputHeader, strconv.FormatInt(r.usage.Input, 10))
	h.Set(stack.LLMCachedHeader, strconv.FormatInt(r.usage.Cached, 10))
	if r.sse {
		h.Set(stack.LLMStreamHeader, "1")
	}
	if r.textTokens >= 0 {
		h.Set(stack.LLMTextHeader, strconv.Itoa(r.textTokens))
	}
	if r.write > 0 {
		h.Set(stack.LLMWriteHeader, strconv.Itoa(r.write))
	}
	if r.paceUs > 0 {
		h.Set(stack.LLMPaceHeader, strconv.Itoa(r.paceUs))
	}
	if r.malform != "" {
		h.Set(stack.LLMMalformHeader, r.malform)
	}
	if r.hold != "" {
		h.Set(stack.UsageHoldHeader, r.hold)
	}
	return req
}

// llmAnswer is what the client got.
type llmAnswer struct {
	status     int
	body       string
	retryAfter string
	rateLimit  string
}

// llmBurst sends reqs through ln at once, held by the upstream after their
// first write on gate until every one is decided, and returns the answers.
func (e *env) llmBurst(t *testing.T, ln, gate string, reqs []llmRequest) []stack.BurstAnswer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out := stack.Burst(ctx, len(reqs), func(ctx context.Context, i int) (*http.Response, error) {
		r := reqs[i]
		r.hold = gate
		return e.client.Do(e.newLLMRequest(ctx, ln, r))
	}, true, nil, func() { e.up.Release(gate) })
	for i, a := range out {
		if a.Err != nil {
			t.Fatalf("request %d: %v", i, a.Err)
		}
	}
	return out
}

// do sends r through ln and returns the answer, read whole.
func (e *env) do(t *testing.T, ln string, r llmRequest) llmAnswer {
	t.Helper()
	resp, err := e.client.Do(e.newLLMRequest(context.Background(), ln, r))
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	return llmAnswer{status: resp.StatusCode, body: string(b), retryAfter: resp.Header.Get("Retry-After"), rateLimit: resp.Header.Get("RateLimit")}
}

// llmLoad is 64 streamed requests on key, of random prompts (100 to 500
// tokens at 4 bytes a token), random max_tokens (50 to 500) and random
// usage: the prompt's estimate off by -30% to +50%, and output below
// max_tokens but for a fifth past it; the three APIs in turn. Most cost
// less than their reserve, some more.
func llmLoad(seed uint64, key string) []llmRequest {
	r := rand.New(rand.NewPCG(seed, 7))
	formats := []string{"openai_chat", "openai_responses", "anthropic"}
	reqs := make([]llmRequest, 64)
	for i := range reqs {
		q := llmRequest{key: key, format: formats[i%3], model: "gpt-4o", sse: true, textTokens: -1,
			promptBytes: 400 + r.IntN(1600), maxTokens: 50 + r.IntN(451)}
		est := (q.promptBytes + 3) / 4
		input := est * (70 + r.IntN(81)) / 100
		cached := 0
		if i%4 == 0 {
			cached, input = input/2, input-input/2
		}
		out := q.maxTokens * (10 + r.IntN(86)) / 100
		if i%5 == 0 {
			out = q.maxTokens + 1 + r.IntN(200)
		}
		q.usage = stack.LLMUsage{Input: int64(input), Cached: int64(cached), Output: int64(out)}
		reqs[i] = q
	}
	return reqs
}

// testLLMExact: 64 concurrent streams on one key, each reserving from its
// request and settling what its answer reported: the control plane's
// charged total is exactly the reported usage, after the charges and the
// refunds.
func testLLMExact(t *testing.T, e *env) {
	key := freshKey("llm-exact")
	reqs := llmLoad(uint64(time.Now().UnixNano()), key)
	var reserved, want, above int64
	for _, r := range reqs {
		reserved += r.reserve()
		want += r.usage.Total()
		if r.usage.Total() > r.reserve() {
			above++
		}
	}
	refunds, missing := e.filterStat("sluice.usage_refunds"), e.filterStat(statMissing)
	for i, a := range e.llmBurst(t, lnLLMExact, key, reqs) {
		if a.Status != 200 || !strings.Contains(string(a.Body), stack.LLMToken) {
			t.Fatalf("request %d: status %d", i, a.Status)
		}
	}
	reported := e.up.Reported(key)
	e.waitChargedTo(t, domain, "llm_exact", key, llmExactLimit, reported)
	// Settle a moment more: a charge or a refund that came late would move it.
	charged := e.waitChargedStable(t, cpRedis, "llm_exact", key, llmExactLimit)
	t.Logf("64 streams: reserved %d tokens, the upstream reported %d (%d of 64 above their reserve), the control plane charged %d; %d refunds",
		reserved, reported, above, charged, e.filterStat("sluice.usage_refunds")-refunds)
	if reported != want || charged != reported {
		t.Fatalf("charged %d, reported %d (asked %d): want them equal", charged, reported, want)
	}
	if above == 0 || above == 64 || e.filterStat(statMissing) != missing {
		t.Fatalf("%d above their reserve (want some, not all); usage_missing +%d", above, e.filterStat(statMissing)-missing)
	}
}

// statMissing is the filter's counter of usages missing.
const statMissing = "sluice.usage_missing"

// waitChargedTo polls what the control plane charged a key of domain dom
// until it is exactly want (refunds lower it) or settleWait passes, and
// returns its last value.
func (e *env) waitChargedTo(t *testing.T, dom, key, value string, limit, want int64) int64 {
	t.Helper()
	for deadline := time.Now().Add(settleWait); ; time.Sleep(20 * time.Millisecond) {
		if v := e.chargedIn(t, cpRedis, dom, key, value, limit); v == want || time.Now().After(deadline) {
			return v
		}
	}
}

// waitChargedStable polls the charged total until two reads a settle
// interval apart agree, and returns it.
func (e *env) waitChargedStable(t *testing.T, cp, key, value string, limit int64) int64 {
	t.Helper()
	last := e.charged(t, cp, key, value, limit)
	for deadline := time.Now().Add(settleWait); time.Now().Before(deadline); {
		time.Sleep(300 * time.Millisecond) // (the settle interval is 100 ms: this waits for batches, not for time to pass)
		v := e.charged(t, cp, key, value, limit)
		if v == last {
			return v
		}
		last = v
	}
	return last
}

// testLLMOvershoot: the same kind of load against 20,000 tokens a day,
// with the reserve from the request and with a reserve of 0. Reserving from
// the request admits what the estimates fit, and the admitted usage stays
// within the limit plus the usage beyond the reserves (the prompt's
// estimate's error); a reserve of 0 admits every request that starts before
// the first ends.
func testLLMOvershoot(t *testing.T, e *env) {
	seed := uint64(time.Now().UnixNano())
	type run struct {
		admitted, refused int
		usage, bound      int64
	}
	do := func(ln, keyPrefix string) run {
		key := freshKey(keyPrefix)
		reqs := llmLoad(seed, key)
		var r run
		r.bound = llmBoundLimit
		for i, a := range e.llmBurst(t, ln, key, reqs) {
			switch a.Status {
			case 200:
				r.admitted++
				r.usage += reqs[i].usage.Total()
				r.bound += max(0, reqs[i].usage.Total()-reqs[i].reserve())
			case 429:
				r.refused++
			default:
				t.Fatalf("%s request %d: status %d", ln, i, a.Status)
			}
		}
		if got := e.up.Reported(key); got != r.usage {
			t.Fatalf("%s: the upstream reported %d, the admitted requests' usage is %d", ln, got, r.usage)
		}
		return r
	}
	ours, zero := do(lnLLMBound, "llm-bound"), do(lnLLMZero, "llm-zero")
	t.Logf("64 concurrent streams (seed %d), %d tokens a day:", seed, llmBoundLimit)
	t.Logf("%-28s %8s %8s %13s %9s %s", "path", "admitted", "refused", "admitted use", "overshoot", "stated bound")
	t.Logf("%-28s %8d %8d %13d %9d %d (limit + use beyond the reserves)", "reserve from the request", ours.admitted, ours.refused, ours.usage, max(0, ours.usage-llmBoundLimit), ours.bound)
	t.Logf("%-28s %8d %8d %13d %9d %s", "reserve 0", zero.admitted, zero.refused, zero.usage, max(0, zero.usage-llmBoundLimit), "all the usage in flight")
	if ours.usage > ours.bound || ours.admitted == 0 || ours.refused == 0 {
		t.Errorf("reserve from the request: admitted %d (refused %d), usage %d past the stated bound %d", ours.admitted, ours.refused, ours.usage, ours.bound)
	}
	if zero.usage <= llmBoundLimit {
		t.Errorf("reserve 0: admitted usage %d within the limit: the comparison shows nothing", zero.usage)
	}
}

// testLLMCut: a key with 1,000 tokens and a stream that would produce
// 5,000 (it asks for max_tokens 100, the upstream ignores it): the stream
// draws slices of 100 past its reserve until the key has none left; the
// client gets at most 1,000 tokens plus one slice, then the provider's error
// event, and nothing after; the key is then refused with Retry-After until
// its window ends.
func testLLMCut(t *testing.T, e *env) {
	for _, format := range []string{"openai_chat", "anthropic"} {
		t.Run(format, func(t *testing.T) {
			key := freshKey("llm-cut-" + format)
			cuts, draws, refused := e.filterStat("sluice.llm_cuts"), e.filterStat("sluice.llm_draws"), e.filterStat("sluice.llm_draws_refused")
			// 300 bytes a write, cut anywhere in the events, at about 10
			// tokens a millisecond (a fast model is 100 a second).
			r := llmRequest{key: key, format: format, model: "gpt-4o", sse: true, promptBytes: 40, maxTokens: 100, textTokens: -1,
				usage: stack.LLMUsage{Input: 10, Output: 5000}, write: 300, paceUs: 200}
			a := e.do(t, lnLLMCut, r)
			got := strings.Count(a.body, stack.LLMToken)
			errorEvent := `"code":"rate_limit_exceeded"`
			if format == "anthropic" {
				errorEvent = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"rate_limit_error\""
			}
			t.Logf("%s: the client got %d of 5,000 tokens (a budget of %d, slices of %d), then the error event: %v",
				format, got, llmCutLimit, llmSlice, strings.Contains(a.body, errorEvent))
			// The cut comes when the key has nothing left, or (a machine too
			// busy to answer a draw while the stream produces a slice)
			// earlier: never later than a slice past the budget.
			if a.status != 200 || got > llmCutLimit+llmSlice || !strings.Contains(a.body, errorEvent) ||
				!strings.HasSuffix(a.body, "}\n\n") || strings.Contains(a.body, "[DONE]") || strings.Contains(a.body, "message_stop") {
				t.Fatalf("status %d, %d tokens; the body ends %q", a.status, got, a.body[max(0, len(a.body)-300):])
			}
			if i := strings.Index(a.body, errorEvent); strings.Count(a.body[i:], stack.LLMToken) != 0 {
				t.Fatal("tokens after the error event")
			}
			if e.waitStat("sluice.llm_cuts", cuts+1, settleWait) != cuts+1 || e.filterStat("sluice.llm_draws") <= draws ||
				e.filterStat("sluice.llm_draws_refused") > refused+1 {
				t.Fatalf("cuts +%d, draws +%d, refused +%d", e.filterStat("sluice.llm_cuts")-cuts,
					e.filterStat("sluice.llm_draws")-draws, e.filterStat("sluice.llm_draws_refused")-refused)
			}
			// The stream's usage is settled: the key is over its limit.
			e.waitCharged(t, cpRedis, "llm_cut", key, llmCutLimit, llmCutLimit, settleWait)
			var next llmAnswer
			for deadline := time.Now().Add(settleWait); ; time.Sleep(50 * time.Millisecond) {
				before := time.Now()
				next = e.do(t, lnLLMCut, llmRequest{key: key, format: format, model: "gpt-4o", sse: true, promptBytes: 40, maxTokens: 10,
					textTokens: -1, usage: stack.LLMUsage{Input: 10, Output: 5}})
				if next.status == 429 {
					// The local block tells the time from when its answer
					// arrived, rounded up: at most a second or two late.
					lo, hi := int64(untilMidnight(time.Now())/time.Second), int64(untilMidnight(before)/time.Second)+3
					ra, err := strconv.ParseInt(next.retryAfter, 10, 64)
					if err != nil || ra < lo || ra > hi {
						t.Fatalf("the next request: Retry-After %q, want %d..%d s (until the day's window ends)", next.retryAfter, lo, hi)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the next request: status %d, want 429 once the stream settled", next.status)
				}
			}
		})
	}
}

// testLLMMalformed: answers that are not JSON, cut mid-way, without usage,
// or enormous (a 6 MiB SSE event, a 6 MiB JSON body) reach the client
// untouched and are charged per missing (7, against a reserve of 50),
// counted; while enormous answers stream, other requests are served, and
// Envoy's memory does not grow by the answers' size.
func testLLMMalformed(t *testing.T, e *env) {
	key := freshKey("llm-bad")
	type tc struct {
		name, format, malform string
		sse                   bool
	}
	cases := []tc{
		{"json garbage", "openai_chat", "garbage", false},
		{"sse garbage", "openai_chat", "garbage", true},
		{"json truncated", "anthropic", "truncate", false},
		{"sse truncated", "openai_responses", "truncate", true},
		{"sse no usage", "openai_chat", "no-usage", true},
		{"sse enormous event", "openai_chat", "enormous", true},
		{"json enormous", "openai_chat", "enormous", false},
	}
	missing, malformed, oversized := e.filterStat(statMissing), e.filterStat("sluice.llm_answer_malformed"), e.filterStat("sluice.llm_events_oversized")
	heap0, rss0 := e.envoy.Stat("server.memory_allocated"), e.envoy.RSS()
	var wg sync.WaitGroup
	errs := make([]string, len(cases))
	for i, c := range cases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := llmRequest{key: key, format: c.format, model: "gpt-4o", sse: c.sse, promptBytes: 40, maxTokens: 10, textTokens: -1,
				usage: stack.LLMUsage{Input: 10, Output: 20}, malform: c.malform, write: 64 << 10}
			resp, err := e.client.Do(e.newLLMRequest(context.Background(), lnLLMBad, r))
			if err != nil {
				errs[i] = err.Error()
				return
			}
			n, err := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || err != nil || (c.malform == "enormous" && n < stack.LLMEnormousBytes) {
				errs[i] = fmt.Sprintf("status %d, %d bytes, %v", resp.StatusCode, n, err)
			}
		}()
	}
	// Meanwhile, a well-formed request of another key is served.
	ok := e.do(t, lnLLMBad, llmRequest{key: key + "-ok", format: "anthropic", model: "claude-sonnet-4-5", sse: true, promptBytes: 40,
		maxTokens: 10, textTokens: -1, usage: stack.LLMUsage{Input: 10, Output: 20}})
	wg.Wait()
	for i, err := range errs {
		if err != "" {
			t.Fatalf("%s: %s", cases[i].name, err)
		}
	}
	if ok.status != 200 {
		t.Fatalf("a well-formed request during the malformed answers: status %d", ok.status)
	}
	n := int64(len(cases))
	if got := e.waitChargedTo(t, domain, "llm_bad", key, llmBadLimit, n*llmBadMissing); got != n*llmBadMissing {
		t.Fatalf("charged %d for %d malformed answers, want %d (missing: %d each)", got, n, n*llmBadMissing, llmBadMissing)
	}
	if got := e.waitChargedTo(t, domain, "llm_bad", key+"-ok", llmBadLimit, 30); got != 30 {
		t.Fatalf("the well-formed request: charged %d, want 30", got)
	}
	heap1, rss1 := e.envoy.Stat("server.memory_allocated"), e.envoy.RSS()
	t.Logf("%d malformed answers: usage_missing +%d, llm_answer_malformed +%d, llm_events_oversized +%d; Envoy's heap %d -> %d bytes, RSS %d -> %d",
		n, e.filterStat(statMissing)-missing, e.filterStat("sluice.llm_answer_malformed")-malformed,
		e.filterStat("sluice.llm_events_oversized")-oversized, heap0, heap1, rss0, rss1)
	if e.filterStat(statMissing)-missing != n || e.filterStat("sluice.llm_answer_malformed")-malformed < 3 ||
		e.filterStat("sluice.llm_events_oversized")-oversized != 1 {
		t.Fatal("the malformed answers were not all counted")
	}
	// The filter keeps nothing of a body: had it kept the two enormous
	// answers, its VMs' memory (V8's, outside Envoy's heap) would have
	// grown by their size at least.
	if heap1-heap0 > 16<<20 || rss1-rss0 > 2*stack.LLMEnormousBytes {
		t.Fatalf("Envoy's heap grew by %d bytes, its RSS by %d, over answers of %d bytes each", heap1-heap0, rss1-rss0, stack.LLMEnormousBytes)
	}
}
