package usage

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/e2e/stack"
)

// docsCluster is the control plane's cluster in docs/llm.md's example.
const docsCluster = "sluice_controlplane"

// docsExample returns the policy (the page's first YAML block) and the
// plugin configuration (its first JSON block) of docs/llm.md, as written.
func docsExample(t *testing.T) (policy string, plugin []byte) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "llm.md"))
	if err != nil {
		t.Fatal(err)
	}
	block := func(lang string) string {
		_, rest, ok := strings.Cut(string(b), "```"+lang+"\n")
		if !ok {
			t.Fatalf("docs/llm.md has no %s block", lang)
		}
		text, _, _ := strings.Cut(rest, "```")
		return text
	}
	policy, plugin = block("yaml"), []byte(block("json"))
	var pc struct{ Cluster, Domain string }
	if err := json.Unmarshal(plugin, &pc); err != nil || pc.Cluster != docsCluster || pc.Domain != "llm" {
		t.Fatalf("docs/llm.md's plugin configuration: cluster %q, domain %q (%v): the test expects %q and llm", pc.Cluster, pc.Domain, err, docsCluster)
	}
	return policy, plugin
}

// docsLimit is the docs' budget: $50 in micro-dollars.
const docsLimit = 50_000_000

// testLLMDocs runs docs/llm.md's example as written: a budget of $50 a
// calendar month (UTC) per API key, gpt-4o and claude-sonnet-4-5 priced per
// million tokens. A request reserves its estimate in micro-dollars; its
// answer's usage is what it costs (the page's own figures); and a key that
// spent its month is refused until the first of next month.
func testLLMDocs(t *testing.T, e *env) {
	key := freshKey("docs")
	// The page's request: gpt-4o, 2,000 bytes of prompt, max_tokens 1000,
	// answered with 480 input tokens (200 cached) and 610 output.
	a := e.do(t, lnDocs, llmRequest{key: key, format: "openai_chat", model: "gpt-4o", promptBytes: 2000, maxTokens: 1000, textTokens: -1,
		usage: stack.LLMUsage{Input: 280, Cached: 200, Output: 610}})
	if a.status != 200 || remaining(a.rateLimit) != docsLimit-11_250 {
		t.Fatalf("gpt-4o: status %d, RateLimit %q: want 200 and %d left once its reserve (11,250) is taken", a.status, a.rateLimit, docsLimit-11_250)
	}
	monthEnd := func(now time.Time) time.Time {
		now = now.UTC()
		return time.Date(now.Year(), now.Month()+1, 1, 0, 0, 0, 0, time.UTC)
	}
	if w := rateLimitWindow(a.rateLimit); w < int64(time.Until(monthEnd(time.Now()))/time.Second)-60 || w > int64(time.Until(monthEnd(time.Now()))/time.Second)+1 {
		t.Errorf("RateLimit %q: t=%d, want the seconds to the month's end", a.rateLimit, w)
	}
	if got := e.waitChargedTo(t, "llm", "api_key", key, docsLimit, 7050); got != 7050 {
		t.Fatalf("gpt-4o: charged %d micro-dollars, want the page's 7,050", got)
	}
	// claude-sonnet-4-5, streamed: 300 input, 5,000 read from the cache,
	// 800 output: 900 + 1,500 + 12,000.
	a = e.do(t, lnDocs, llmRequest{key: key, format: "anthropic", model: "claude-sonnet-4-5-20250929", sse: true, promptBytes: 400,
		maxTokens: 1000, textTokens: -1, usage: stack.LLMUsage{Input: 300, Cached: 5000, Output: 800}})
	if a.status != 200 {
		t.Fatalf("claude: status %d", a.status)
	}
	if got := e.waitChargedTo(t, "llm", "api_key", key, docsLimit, 7050+14_400); got != 7050+14_400 {
		t.Fatalf("after claude: charged %d, want %d", got, 7050+14_400)
	}
	// A model no row names costs the default row's: 700,000 output tokens
	// at $75/M spend the month.
	a = e.do(t, lnDocs, llmRequest{key: key, format: "openai_chat", model: "o9-preview", promptBytes: 40, maxTokens: 10, textTokens: 10,
		usage: stack.LLMUsage{Input: 10, Output: 700_000}})
	if a.status != 200 {
		t.Fatalf("o9-preview: status %d", a.status)
	}
	e.waitChargedIn(t, "llm", key, docsLimit)
	for deadline := time.Now().Add(settleWait); ; time.Sleep(50 * time.Millisecond) {
		before := time.Now()
		a = e.do(t, lnDocs, llmRequest{key: key, format: "openai_chat", model: "gpt-4o", promptBytes: 40, maxTokens: 10, textTokens: -1,
			usage: stack.LLMUsage{Input: 10, Output: 5}})
		if a.status == 429 {
			lo, hi := int64(time.Until(monthEnd(time.Now()))/time.Second), int64(monthEnd(before).Sub(before)/time.Second)+3 // a local block: up to a second or two late, rounded up
			ra, err := strconv.ParseInt(a.retryAfter, 10, 64)
			if err != nil || ra < lo || ra > hi {
				t.Fatalf("a spent month: Retry-After %q, want %d..%d s (until the first of next month, UTC)", a.retryAfter, lo, hi)
			}
			t.Logf("the month spent: 429, Retry-After %s s (%s)", a.retryAfter, monthEnd(time.Now()).Format(time.RFC3339))
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the month was spent: status %d, want 429", a.status)
		}
	}
}

// waitChargedIn polls what the docs' key key has been charged (domain dom,
// on the Redis control plane) until it reaches want.
func (e *env) waitChargedIn(t *testing.T, dom, key string, want int64) int64 {
	t.Helper()
	for deadline := time.Now().Add(settleWait); ; time.Sleep(20 * time.Millisecond) {
		if v := e.chargedIn(t, cpRedis, dom, "api_key", key, docsLimit); v >= want || time.Now().After(deadline) {
			return v
		}
	}
}

// rateLimitWindow returns the t parameter of a RateLimit field, or -1.
func rateLimitWindow(field string) int64 { return rateLimitParam(field, "t") }
