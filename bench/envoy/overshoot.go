package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/e2e/stack"
)

// The overshoot table (-overshoot): one load of 64 concurrent streamed LLM
// requests (random prompts and max_tokens, random usage: most below what
// they may use, a fifth past max_tokens) against a budget of
// overshootLimit tokens a day, on five paths:
//
//	envoy+peer    Envoy's ratelimit filter as Envoy Gateway and Envoy AI Gateway configure it: a request-time
//	              check of cost 0, the usage at stream end (apply_on_stream_done, hits_addend from dynamic
//	              metadata), envoyproxy/ratelimit on Redis
//	envoy+sluice  the same, sluice's control plane
//	zero          sluice's filter, reserve 0, the usage from the answer
//	request       sluice's filter, the reserve from the request body
//	cut           the same, streams cut when the key's budget runs out (slices of overshootSlice)
//
// Each path gets the same requests (the same seed within a run) on a fresh
// key; every stream is held after its first chunk until all 64 are decided,
// so that all run at once. A row says how many were admitted, the usage
// they were billed (what the upstream reported), the usage the clients got
// (prompts and output tokens delivered: less when a stream is cut), and
// the overshoot past the budget.

const (
	overshootLimit   = 20_000
	overshootStreams = 64
	overshootSlice   = 200
)

// overshootPath is one path of the table.
type overshootPath struct {
	id, name string
	peer     bool // envoyproxy/ratelimit, not sluice
}

var overshootPaths = []overshootPath{
	{"envoy+peer", "Envoy ratelimit, apply_on_stream_done, envoyproxy/ratelimit", true},
	{"envoy+sluice", "Envoy ratelimit, apply_on_stream_done, sluice", false},
	{"zero", "sluice filter, reserve 0", false},
	{"request", "sluice filter, reserve from the request", false},
	{"cut", "sluice filter, reserve from the request, cut", false},
}

// overshootRow is what one path measured in one run.
type overshootRow struct {
	admitted, refused     int
	billed, got, overshot int64
}

// overshootPolicy is the budget, for sluice (charge_past_limit: the usage
// at stream end happened; settlements are charged past the limit anyway)
// and for envoyproxy/ratelimit (which always charges).
func overshootPolicy(peer bool) string {
	past := "\n    charge_past_limit: true"
	if peer {
		past = ""
	}
	return "domain: bench\ndescriptors:\n  - key: user" + past +
		"\n    rate_limit: {unit: day, requests_per_unit: " + strconv.Itoa(overshootLimit) + "}\n"
}

// overshoot runs the table: cfg.runs runs of every path, and the medians.
func (b *built) overshoot(ctx context.Context, dir string, cfg config) error {
	up, err := stack.StartUsageUpstream("127.0.0.1:0", userHeader)
	if err != nil {
		return err
	}
	defer up.Close(context.Background())
	fmt.Printf("overshoot: %d concurrent streamed requests against %d tokens a day, %d runs (Envoy %s, --concurrency %d)\n",
		overshootStreams, overshootLimit, cfg.runs, b.envoyVersion, cfg.concurrency)
	fmt.Printf("%-13s %-4s %8s %8s %10s %10s %10s\n", "path", "run", "admitted", "refused", "billed", "delivered", "overshoot")
	rows := map[string][]overshootRow{}
	for r := 1; r <= cfg.runs; r++ {
		seed := uint64(time.Now().UnixNano())
		for _, peer := range []bool{true, false} {
			if peer && !cfg.overshootPeer {
				continue
			}
			if err := b.overshootRun(ctx, dir, cfg, up, peer, seed, r, rows); err != nil {
				return err
			}
		}
	}
	fmt.Printf("\nmedians of %d runs (billed: the usage the upstream reported for the admitted requests; delivered: what their clients got; overshoot: billed past the budget):\n", cfg.runs)
	fmt.Printf("| path | admitted | billed | delivered | overshoot |\n|---|---|---|---|---|\n")
	for _, p := range overshootPaths {
		rs := rows[p.id]
		if len(rs) == 0 {
			continue
		}
		med := func(get func(overshootRow) float64) float64 { return medianOf(rs, get) }
		fmt.Printf("| %s | %.0f | %.0f | %.0f | %.0f |\n", p.name, med(func(r overshootRow) float64 { return float64(r.admitted) }),
			med(func(r overshootRow) float64 { return float64(r.billed) }), med(func(r overshootRow) float64 { return float64(r.got) }),
			med(func(r overshootRow) float64 { return float64(r.overshot) }))
	}
	return nil
}

// overshootRun runs the load once on the paths of one service (the peer's,
// or sluice's).
func (b *built) overshootRun(ctx context.Context, dir string, cfg config, up *stack.UsageUpstream, peer bool, seed uint64, run int, rows map[string][]overshootRow) error {
	kind := rlsSluice
	if peer {
		kind = rlsPeer
	}
	svc, err := b.startService(ctx, dir, kind, overshootPolicy(peer))
	if err != nil {
		return err
	}
	defer svc.stop()
	var listeners []stack.M
	var paths []overshootPath
	for _, p := range overshootPaths {
		if p.peer == peer {
			listeners = append(listeners, overshootListener(b, p.id, up.Addr()))
			paths = append(paths, p)
		}
	}
	clusters := []stack.M{stack.GRPCCluster("up", up.Addr()), stack.GRPCCluster(rlsCluster, svc.addr)}
	e, err := stack.StartEnvoy(ctx, stack.EnvoyConfig{Binary: b.envoy, Dir: dir, Name: fmt.Sprintf("envoy-overshoot-%v-%d", peer, run),
		Bootstrap: stack.Bootstrap(listeners, clusters), Concurrency: cfg.concurrency, LogLevel: "warning"})
	if err != nil {
		return err
	}
	defer e.Stop()
	client := &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 2 * overshootStreams}}
	defer client.CloseIdleConnections()
	for _, p := range paths {
		key := fmt.Sprintf("%s-%d-%d", p.id, run, seed%1000000)
		row, err := overshootBurst(ctx, client, e.URL(p.id), up, overshootLoad(seed, key))
		if err != nil {
			return fmt.Errorf("overshoot %s: %w", p.id, err)
		}
		row.overshot = max(0, row.billed-overshootLimit)
		rows[p.id] = append(rows[p.id], row)
		fmt.Printf("%-13s %-4d %8d %8d %10d %10d %10d\n", p.id, run, row.admitted, row.refused, row.billed, row.got, row.overshot)
	}
	return nil
}

// overshootListener is the listener of path id, its upstream the usage
// upstream (cluster "up", HTTP/2).
func overshootListener(b *built, id, upstream string) stack.M {
	route := stack.RouteTo("/", "up")
	route["route"].(stack.M)["timeout"] = "0s"
	key := []stack.M{{"request_headers": stack.M{"header_name": userHeader, "descriptor_key": "user"}}}
	if strings.HasPrefix(id, "envoy") {
		lua := stack.ResponseCost(route, key, stack.UsageReportHeader)
		rl := stack.RateLimitFilter(domain, rlsCluster, stack.M{"failure_mode_deny": false, "timeout": "1s"})
		return stack.HTTPListener(id, 0, []stack.M{stack.VirtualHost("all", route)}, lua, rl)
	}
	usage := map[string]any{"reserve": 0, "source": map[string]any{"llm_usage": map[string]any{}}}
	if id != "zero" {
		usage["reserve_from_request"] = true
	}
	if id == "cut" {
		usage["cut"] = map[string]any{"slice": overshootSlice}
	}
	plugin, _ := json.Marshal(map[string]any{
		"cluster": rlsCluster, "domain": domain, "timeout": "1s", "failure_mode": "closed",
		"rate_limits": []any{map[string]any{"actions": []any{map[string]any{
			"request_headers": map[string]any{"header_name": userHeader, "descriptor_key": "user"}}}, "usage": usage}},
		"settle": map[string]any{"interval_ms": 20},
	})
	f := wasmFilter(b.filterWasm, plugin)
	f["typed_config"].(stack.M)["config"].(stack.M)["allow_on_headers_stop_iteration"] = true
	return stack.HTTPListener(id, 0, []stack.M{stack.VirtualHost("all", route)}, f)
}

// overshootRequest is one request of the load.
type overshootRequest struct {
	key               string
	prompt, maxTokens int
	input, output     int64
}

// overshootLoad is the 64 requests on key (as e2e/usage's load): prompts
// of 100 to 500 tokens at 4 bytes a token, max_tokens 50 to 500, the
// prompt's estimate off by -30% to +50%, output below max_tokens but for a
// fifth past it.
func overshootLoad(seed uint64, key string) []overshootRequest {
	r := rand.New(rand.NewPCG(seed, 7))
	reqs := make([]overshootRequest, overshootStreams)
	for i := range reqs {
		q := overshootRequest{key: key, prompt: 400 + r.IntN(1600), maxTokens: 50 + r.IntN(451)}
		q.input = int64((q.prompt + 3) / 4 * (70 + r.IntN(81)) / 100)
		q.output = int64(q.maxTokens * (10 + r.IntN(86)) / 100)
		if i%5 == 0 {
			q.output = int64(q.maxTokens + 1 + r.IntN(200))
		}
		reqs[i] = q
	}
	return reqs
}

// overshootBurst sends reqs at once to url, each held by the upstream
// after its first chunk until all are decided, and sums up what came of
// them.
func overshootBurst(ctx context.Context, client *http.Client, url string, up *stack.UsageUpstream, reqs []overshootRequest) (overshootRow, error) {
	gate := reqs[0].key
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	out := stack.Burst(ctx, len(reqs), func(ctx context.Context, i int) (*http.Response, error) {
		q := reqs[i]
		body := `{"model":"gpt-4o","max_tokens":` + strconv.Itoa(q.maxTokens) + `,"stream":true,"stream_options":{"include_usage":true},` +
			`"messages":[{"role":"user","content":"` + strings.Repeat("p", q.prompt) + `"}]}`
		req, err := http.NewRequestWithContext(ctx, "POST", url+"/v1/chat/completions", strings.NewReader(body))
		if err != nil {
			return nil, err
		}
		h := req.Header
		h.Set(userHeader, q.key)
		h.Set(stack.LLMFormatHeader, "openai_chat")
		h.Set(stack.LLMStreamHeader, "1")
		h.Set(stack.UsageTokensHeader, strconv.FormatInt(q.output, 10))
		h.Set(stack.LLMInputHeader, strconv.FormatInt(q.input, 10))
		h.Set(stack.UsageHoldHeader, gate)
		h.Set(stack.LLMPaceHeader, "200") // a fast model: 5 tokens a millisecond
		return client.Do(req)
	}, true, nil, func() { up.Release(gate) })
	var row overshootRow
	for i, a := range out {
		switch {
		case a.Err != nil:
			return row, fmt.Errorf("request %d: %w", i, a.Err)
		case a.Status == 200:
			row.admitted++
			row.got += reqs[i].input + int64(strings.Count(string(a.Body), stack.LLMToken))
		case a.Status == 429:
			row.refused++
		default:
			return row, fmt.Errorf("request %d: status %d", i, a.Status)
		}
	}
	row.billed = up.Reported(reqs[0].key)
	return row, nil
}
