package main

import (
	"bufio"
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/e2e/stack"
)

//go:embed load.lua
var loadScript []byte

// benchCase is one setup under one load.
type benchCase struct {
	setup setup
	load  load
}

func (c benchCase) key() string { return c.setup.id + "/" + string(c.load) }

// result is what one run measured. CPU figures are per request, in
// microseconds of user plus system time.
type result struct {
	rps, p50ms, p99ms     float64
	envoyUS, rlsUS, redUS float64
	non2xx                float64 // share of answers that were not 2xx (429s)
	rlsCalls              float64 // calls to the rate limit service per request
	local                 float64 // share of requests the filter answered without a call (precheck, quota)
	settleCalls           float64 // settle calls per request (usage setups)
	settled               float64 // settlements acknowledged per request (usage setups)
	rssMB                 float64 // Envoy's RSS after the run
}

// wrkOut is what load.lua prints when wrk is done.
type wrkOut struct {
	Requests   int64 `json:"requests"`
	DurationUS int64 `json:"duration_us"`
	P50US      int64 `json:"p50_us"`
	P99US      int64 `json:"p99_us"`
	Non2xx     int64 `json:"non2xx"`
	Errors     int64 `json:"errors"`
}

func lookWrk() (string, error) {
	p, err := exec.LookPath("wrk")
	if err != nil {
		return "", fmt.Errorf("wrk is not installed (Debian: apt-get install wrk; `make bench-envoy` does it as root)")
	}
	return p, nil
}

// measure starts the setup's service and Envoy, warms up, and measures one
// run of its load.
func (b *built) measure(ctx context.Context, dir string, cfg config, c benchCase) (result, error) {
	svc, err := b.startService(ctx, dir, c.setup.rls, "")
	if err != nil {
		return result{}, err
	}
	defer svc.stop()
	backend, err := stack.FreePort()
	if err != nil {
		return result{}, err
	}
	e, err := stack.StartEnvoy(ctx, stack.EnvoyConfig{
		Binary: b.envoy, Dir: dir, Name: "envoy-" + c.setup.id + "-" + string(c.load),
		Bootstrap:   c.setup.bootstrap(b, backend, svc.addr),
		Concurrency: cfg.concurrency, LogLevel: "warning",
	})
	if err != nil {
		return result{}, err
	}
	defer e.Stop()
	url := e.URL("ingress") + "/"
	if err := checkAdds(ctx, url, c.setup.adds); err != nil {
		return result{}, fmt.Errorf("setup %s: %w", c.setup.id, err)
	}
	var env []string
	if c.setup.body > 0 {
		env = []string{"BENCH_BODY=" + b.bodies[c.setup.body]}
	}
	if _, err := b.wrk(ctx, dir, url, c.load, cfg.connections, cfg.warmup, env...); err != nil {
		return result{}, fmt.Errorf("warm-up: %w", err)
	}
	s0, err := e.Stats()
	if err != nil {
		return result{}, err
	}
	var m0 stack.Samples
	if cfg.filterStats && svc.metrics != "" {
		m0, _ = stack.Scrape(svc.metrics)
	}
	e0, r0, d0 := stack.ProcCPU(e.PID()), stack.ProcCPU(svc.pid), stack.ProcCPU(b.redis.PID())
	w, err := b.wrk(ctx, dir, url, c.load, cfg.connections, cfg.duration, env...)
	if err != nil {
		return result{}, err
	}
	e1, r1, d1 := stack.ProcCPU(e.PID()), stack.ProcCPU(svc.pid), stack.ProcCPU(b.redis.PID())
	s1, err := e.Stats()
	if err != nil {
		return result{}, err
	}
	n := float64(w.Requests)
	if n == 0 {
		return result{}, fmt.Errorf("wrk made no request")
	}
	if w.Errors > 0 {
		return result{}, fmt.Errorf("wrk: %d socket errors", w.Errors)
	}
	delta := func(name string) float64 { return float64(s1[name] - s0[name]) }
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / n }
	res := result{
		rps:         n / (float64(w.DurationUS) / 1e6),
		p50ms:       float64(w.P50US) / 1e3,
		p99ms:       float64(w.P99US) / 1e3,
		envoyUS:     per(e1 - e0),
		non2xx:      float64(w.Non2xx) / n,
		rlsCalls:    delta("cluster."+rlsCluster+".upstream_rq_total") / n,
		local:       (delta("wasmcustom.sluice.precheck_rejected") + delta("wasmcustom.sluice.quota_allowed")) / n,
		settleCalls: delta("wasmcustom.sluice.usage_settle_calls") / n,
		settled:     delta("wasmcustom.sluice.usage_settled") / n,
		rssMB:       float64(e.RSS()) / (1 << 20),
	}
	if (c.load == loadSpread || c.load == loadSteady || c.load == loadUnique) && res.non2xx > 0 {
		// every key of these loads is well under its limit
		fmt.Fprintf(os.Stderr, "  (setup %s %s: %.2f%% answered 429 on a load under its limits)\n", c.setup.id, c.load, 100*res.non2xx)
	}
	if c.load == loadBlocked && res.non2xx < 0.99 {
		// The blocked setups compare the costs of local 429s: a setup
		// that let requests through would measure something else.
		return result{}, fmt.Errorf("setup %s answered %.1f%% of the blocked load with 429, not all of it", c.setup.id, 100*res.non2xx)
	}
	if c.setup.rls == rlsPeer || c.setup.rls == rlsSluice || c.setup.rls == rlsSluiceLease || c.setup.rls == rlsFloor {
		res.rlsUS, res.redUS = per(r1-r0), per(d1-d0)
	}
	if cfg.filterStats {
		printFilterStats(c, s0, s1, n)
		if m0 != nil {
			if m1, err := stack.Scrape(svc.metrics); err == nil {
				printLeaseStats(c, m0, m1, n)
			}
		}
	}
	if f := delta("wasmcustom.sluice.failure_open") + delta("cluster.ratelimit.error") + delta("cluster.ratelimit.failure_mode_allowed"); f > 0 {
		fmt.Fprintf(os.Stderr, "  (setup %s %s: %.0f answers by failure mode)\n", c.setup.id, c.load, f)
	}
	return res, nil
}

// wrk runs the load for d and returns what load.lua reported; env is
// load.lua's environment beyond BENCH_LOAD.
func (b *built) wrk(ctx context.Context, dir, url string, l load, conns int, d time.Duration, env ...string) (wrkOut, error) {
	script := filepath.Join(dir, "load.lua")
	if err := os.WriteFile(script, loadScript, 0o644); err != nil {
		return wrkOut{}, err
	}
	secs := max(1, int(d.Round(time.Second)/time.Second))
	cmd := exec.CommandContext(ctx, "wrk", "-t1", "-c"+strconv.Itoa(conns), "-d"+strconv.Itoa(secs)+"s",
		"--timeout", "5s", "-s", script, url)
	cmd.Env = append(append(os.Environ(), "BENCH_LOAD="+string(l)), env...)
	out, err := cmd.Output()
	if err != nil {
		return wrkOut{}, fmt.Errorf("wrk: %w\n%s", err, out)
	}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if js, ok := strings.CutPrefix(sc.Text(), "BENCH "); ok {
			var w wrkOut
			if err := json.Unmarshal([]byte(js), &w); err != nil {
				return wrkOut{}, fmt.Errorf("wrk output %q: %w", js, err)
			}
			return w, nil
		}
	}
	return wrkOut{}, fmt.Errorf("wrk printed no result:\n%s", out)
}

func header() string {
	return fmt.Sprintf("%-5s %-8s %-4s %9s %8s %8s %9s %9s %9s %7s %8s %7s %7s",
		"setup", "load", "run", "req/s", "p50_ms", "p99_ms", "envoy_us", "rls_us", "redis_us", "429%", "rls/req", "local%", "rss_MB")
}

func (r result) row(c benchCase, run string) string {
	return fmt.Sprintf("%-5s %-8s %-4s %9.0f %8.3f %8.3f %9.2f %9.2f %9.2f %7.1f %8.3f %7.1f %7.1f",
		c.setup.id, c.load, run, r.rps, r.p50ms, r.p99ms, r.envoyUS, r.rlsUS, r.redUS,
		100*r.non2xx, r.rlsCalls, 100*r.local, r.rssMB)
}

// medianOf returns the median of get over the runs rs.
func medianOf[R any](rs []R, get func(R) float64) float64 {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = get(r)
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

// median returns the field-wise median of the runs.
func median(rs []result) result {
	f := func(get func(result) float64) float64 { return medianOf(rs, get) }
	return result{
		rps: f(func(r result) float64 { return r.rps }), p50ms: f(func(r result) float64 { return r.p50ms }),
		p99ms: f(func(r result) float64 { return r.p99ms }), envoyUS: f(func(r result) float64 { return r.envoyUS }),
		rlsUS: f(func(r result) float64 { return r.rlsUS }), redUS: f(func(r result) float64 { return r.redUS }),
		non2xx: f(func(r result) float64 { return r.non2xx }), rlsCalls: f(func(r result) float64 { return r.rlsCalls }),
		local: f(func(r result) float64 { return r.local }), rssMB: f(func(r result) float64 { return r.rssMB }),
		settleCalls: f(func(r result) float64 { return r.settleCalls }), settled: f(func(r result) float64 { return r.settled }),
	}
}

// summarize prints the goals against the medians that are there.
func summarize(m map[string]result, workers int) {
	get := func(k string) (result, bool) { r, ok := m[k]; return r, ok }
	one, ok1 := get("1/spread")
	two, ok2 := get("2/spread")
	three, ok3 := get("3/spread")
	oneD, ok1d := get("1d/blocked")
	four, ok4 := get("4/blocked")
	if ok1 && ok2 {
		fmt.Printf("empty Go filter adds %.2f us of Envoy CPU per request (2 - 1)\n", two.envoyUS-one.envoyUS)
	}
	if ok1 && ok3 {
		fmt.Printf("Envoy's local_ratelimit (C++) adds %.2f us (3 - 1)\n", three.envoyUS-one.envoyUS)
	}
	if ok1d && ok4 {
		add := four.envoyUS - oneD.envoyUS
		fmt.Printf("sluice filter, decided by the precheck, adds %.2f us (4 - 1d: both answer 429 locally)", add)
		if ok1 && ok2 {
			fmt.Printf("; %.2fx the empty Go filter's (goal <= 1.5x)", add/(two.envoyUS-one.envoyUS))
		}
		fmt.Println()
		if twoR, ok := get("2r/blocked"); ok {
			floor := twoR.envoyUS - oneD.envoyUS
			fmt.Printf("a Go filter making only a rejection's host calls adds %.2f us (2r - 1d); sluice's own work is %.2f us, so sluice costs %.2fx that floor\n",
				floor, add-floor, add/floor)
		}
	}
	if ok1 && ok4 {
		fmt.Printf("Envoy RSS after the runs: %.1f MB with the sluice filter against %.1f MB without, at %d workers (see the memory section for per worker)\n",
			four.rssMB, one.rssMB, workers)
	}
	if five, ok := get("5/spread"); ok {
		if six, ok := get("6/spread"); ok {
			fmt.Printf("drop-in, spread (6 vs 5): service+Redis CPU per decision %.2f vs %.2f us = %.2f (goal <= 0.25); %.2fx req/s (goal >= 2), p99 %.3f vs %.3f ms; Envoy's own CPU %.2f vs %.2f us per request\n",
				six.rlsUS+six.redUS, five.rlsUS+five.redUS, (six.rlsUS+six.redUS)/(five.rlsUS+five.redUS),
				six.rps/five.rps, six.p99ms, five.p99ms, six.envoyUS, five.envoyUS)
		}
	}
	if five, ok := get("5/spread"); ok {
		if floor, ok := get("6f/spread"); ok {
			fmt.Printf("transport floor under Envoy's gRPC client (6f, no decision, no Redis): %.2f us of service CPU per call = %.2f of envoyproxy/ratelimit's service+Redis",
				floor.rlsUS, floor.rlsUS/(five.rlsUS+five.redUS))
			if six, ok := get("6/spread"); ok {
				fmt.Printf("; sluice (6) spends %.2f us above it, Redis included", six.rlsUS+six.redUS-floor.rlsUS)
			}
			fmt.Println()
		}
	}
	summarizeCallout(get)
	summarizeNative(get)
	summarizeUsage(m)
	summarizeLLM(get)
	if five, ok := get("5/flood"); ok {
		if seven, ok := get("7/flood"); ok {
			fmt.Printf("whole system, flood (7 vs 5): %.2fx req/s (goal >= 4), p99 %.3f vs %.3f ms; %.1f%% of setup 7's requests answered in the filter, %.3f service calls per request\n",
				seven.rps/five.rps, seven.p99ms, five.p99ms, 100*seven.local, seven.rlsCalls)
		}
	}
}

// checkAdds sends one request under a key below its limit and fails unless
// its response is a 200 carrying header (none when header is "").
func checkAdds(ctx context.Context, url, header string) error {
	if header == "" {
		return nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	req.Header.Set(userHeader, "check-headers")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get(header) == "" {
		return fmt.Errorf("an admitted request's response: status %d, no %s header (headers %v)", resp.StatusCode, header, resp.Header)
	}
	return nil
}

// summarizeCallout prints the callout goal of the spread load: setup 7's
// Envoy CPU per request at most setup 6's plus what an empty Go filter adds
// (2 - 1), and its requests/s at least setup 6's; with the callout floors
// (2h, 2g: an empty Go Wasm filter making the same call; 2n: an empty native
// Go module making it) beside them.
func summarizeCallout(get func(string) (result, bool)) {
	if seven, ok := get("7/spread"); ok {
		if base, ok := get("7b/spread"); ok {
			fmt.Printf("setup 7 against 7b (-base-wasm), spread: Envoy CPU %.2f against %.2f us per request (%+.2f), %.2fx req/s\n",
				seven.envoyUS, base.envoyUS, seven.envoyUS-base.envoyUS, seven.rps/base.rps)
		}
	}
	one, ok1 := get("1/spread")
	two, ok2 := get("2/spread")
	if !ok1 || !ok2 {
		return
	}
	// 6 adds no rate limit headers; 6h adds Envoy's X-RateLimit ones, as 7
	// adds RateLimit and RateLimit-Policy.
	for _, peer := range []string{"6", "6h"} {
		p, ok := get(peer + "/spread")
		if !ok {
			continue
		}
		goal := p.envoyUS + two.envoyUS - one.envoyUS
		for _, id := range []string{"7", "7g"} {
			if r, ok := get(id + "/spread"); ok {
				fmt.Printf("callout (%s vs %s, spread): Envoy CPU %.2f us per request against the goal %.2f (%s + (2 - 1)) = %.2fx; %.2fx setup %s's req/s (goal >= 1)\n",
					id, peer, r.envoyUS, goal, peer, r.envoyUS/goal, r.rps/p.rps, peer)
			}
		}
	}
	six, ok6 := get("6/spread")
	if !ok6 {
		return
	}
	for _, id := range []string{"2h", "2g", "2n"} {
		if f, ok := get(id + "/spread"); ok {
			fmt.Printf("callout floor %s: %.2f us of Envoy CPU per request (%.2fx setup 6's)", id, f.envoyUS, f.envoyUS/six.envoyUS)
			if seven, ok := get("7/spread"); ok {
				fmt.Printf("; setup 7 is %.2fx it, %.2f us above", seven.envoyUS/f.envoyUS, seven.envoyUS-f.envoyUS)
			}
			fmt.Println()
		}
	}
}

// summarizeUsage prints what settlements cost (issue 24's goal): setups u
// (batched) and u1 (one settle call per request) against setup 7 (the same
// filter without usage) under the spread load, in CPU per request of Envoy,
// of the control plane and of Redis.
func summarizeUsage(m map[string]result) {
	seven, ok7 := m["7/spread"]
	u, oku := m["u/spread"]
	u1, oku1 := m["u1/spread"]
	if !oku || !oku1 {
		return
	}
	fmt.Printf("usage, spread: settle calls per request %.3f batched (u) vs %.3f one per settlement (u1), settlements acknowledged per request %.3f vs %.3f; %.2fx req/s\n",
		u.settleCalls, u1.settleCalls, u.settled, u1.settled, u.rps/u1.rps)
	if !ok7 {
		return
	}
	cost := func(r result) (envoy, cp float64) {
		return r.envoyUS - seven.envoyUS, r.rlsUS + r.redUS - seven.rlsUS - seven.redUS
	}
	be, bc := cost(u)
	oe, oc := cost(u1)
	fmt.Printf("what settlements cost per request over setup 7: Envoy %.2f vs %.2f us, control plane + Redis %.2f vs %.2f us; batched / one call each = %.2f (goal <= 0.5)\n",
		be, oe, bc, oc, (be+bc)/(oe+oc))
}

// printFilterStats prints, for -filter-stats, the filter's counters that
// grew during a run, per request: what the filter did besides deciding
// (renewals, grants, waits).
func printFilterStats(c benchCase, s0, s1 map[string]int64, n float64) {
	filter := func(s map[string]int64) map[string]float64 {
		out := map[string]float64{}
		for name, v := range s {
			if short, ok := strings.CutPrefix(name, "wasmcustom.sluice."); ok {
				out[short] = float64(v)
			}
		}
		return out
	}
	printGrowth(c, "filter counters", filter(s0), filter(s1), n)
}

// printLeaseStats prints, for -filter-stats, the control plane's lease
// counters that grew during a run, per request.
func printLeaseStats(c benchCase, m0, m1 stack.Samples, n float64) {
	lease := func(m stack.Samples) map[string]float64 {
		out := map[string]float64{}
		for _, x := range m {
			if name, ok := strings.CutPrefix(x.Name, "sluice_lease_"); ok {
				if r := x.Labels["reason"]; r != "" {
					name += ":" + r
				}
				out[name] += x.Value
			}
		}
		return out
	}
	printGrowth(c, "control plane lease counters", lease(m0), lease(m1), n)
}

// printGrowth prints to stderr what of counters grew from before to after,
// per request of n.
func printGrowth(c benchCase, counters string, before, after map[string]float64, n float64) {
	var names []string
	for name, v := range after {
		if v > before[name] {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	var b strings.Builder
	for _, name := range names {
		fmt.Fprintf(&b, " %s=%.4f", name, (after[name]-before[name])/n)
	}
	fmt.Fprintf(os.Stderr, "  (setup %s %s, %s per request:%s)\n", c.setup.id, c.load, counters, b.String())
}
