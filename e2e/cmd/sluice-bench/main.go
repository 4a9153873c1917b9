// Command sluice-bench measures sluice end to end through the proxy-wasm
// host: HTTP clients -> gateway (filter.wasm on wazero) -> control plane
// (sluice-controlplane, on Redis or its memory store) -> upstream, all on
// 127.0.0.1. `make bench` runs it.
//
// Three modes:
//
//	precheck  every request is for a key already over its limit: the
//	          filter's precheck decides it locally (429), no callout
//	callout   the precheck is off and every request is admitted: each one
//	          is a control-plane call (RLS over proxy_http_call) and then
//	          goes to the upstream
//	mixed     a flood: 90% of the requests on keys over limit, 10% on keys
//	          under it, precheck on
//
// For each mode it reports requests/s, p50 and p99 latency seen by the
// clients, the share of requests decided locally (filter counters), and
// the filter's time per request, measured by driving the same VM's
// callbacks directly (no sockets). Each mode runs -runs times (default 3)
// and the median run is reported. Work is bounded by -duration and
// -max-requests per run.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/sluicehq/sluice/e2e/host"
	"github.com/sluicehq/sluice/e2e/stack"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "sluice-bench:", err)
		os.Exit(1)
	}
}

// options are the flags.
type options struct {
	duration    time.Duration // per run
	maxRequests int           // per run
	concurrency int           // clients
	runs        int           // runs per mode
	keys        int           // distinct keys per class
	workers     int           // gateway VMs
	store       string        // redis or memory
	modes       []string      // modes to run
	wasm        string        // filter.wasm, built when empty
	timeout     string        // filter's control-plane timeout
}

const domain = "bench"

// benchPolicy: flood-* keys are over limit after one request per hour;
// ok-* keys practically never are.
const benchPolicy = `
domain: bench
descriptors:
  - key: api_key
    value: "flood-*"
    rate_limit: {name: flood, algorithm: fixed_window, unit: hour, requests_per_unit: 1}
  - key: api_key
    value: "ok-*"
    rate_limit: {name: ok, algorithm: token_bucket, unit: second, requests_per_unit: 100000000, burst: 100000000}
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o := &options{}
	fs := flag.NewFlagSet("sluice-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.DurationVar(&o.duration, "duration", 3*time.Second, "length of one run")
	fs.IntVar(&o.maxRequests, "max-requests", 200000, "requests at most in one run")
	fs.IntVar(&o.concurrency, "concurrency", 16, "concurrent clients")
	fs.IntVar(&o.runs, "runs", 3, "runs per mode (the median is reported)")
	fs.IntVar(&o.keys, "keys", 100, "distinct API keys per class (over limit, under limit)")
	fs.IntVar(&o.workers, "workers", 2, "gateway worker VMs")
	fs.StringVar(&o.store, "store", "redis", "control-plane store: redis (a redis-server started on a free port) or memory")
	fs.StringVar(&o.wasm, "wasm", "", "filter.wasm to use (default: built with wasm-build.sh)")
	fs.StringVar(&o.timeout, "timeout", "", "filter timeout for control-plane calls (default: the filter's, 20ms)")
	modes := fs.String("modes", "precheck,callout,mixed", "comma-separated modes")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of this process (clients, gateways, upstream) to `file`")
	if err := fs.Parse(args); err != nil {
		return err
	}
	for _, m := range splitList(*modes) {
		if m != "precheck" && m != "callout" && m != "mixed" {
			return fmt.Errorf("-modes: unknown mode %q (precheck, callout, mixed)", m)
		}
		o.modes = append(o.modes, m)
	}
	switch {
	case o.duration <= 0 || o.duration > 5*time.Minute:
		return fmt.Errorf("-duration must be in (0, 5m], not %v", o.duration)
	case o.maxRequests < 1, o.concurrency < 1, o.runs < 1, o.keys < 1, o.workers < 1:
		return errors.New("-max-requests, -concurrency, -runs, -keys and -workers must be positive")
	case o.store != "redis" && o.store != "memory":
		return fmt.Errorf("-store must be redis or memory, not %q", o.store)
	case len(o.modes) == 0:
		return errors.New("-modes: no mode given")
	}

	tmp, err := os.MkdirTemp("", "sluice-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	b, err := startBench(ctx, o, tmp, stdout)
	if err != nil {
		return err
	}
	defer b.close()

	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	fmt.Fprintf(stdout, "sluice-bench: %d clients, %v per run (at most %d requests), %d runs per mode, %d gateway VMs, control plane on %s, GOMAXPROCS %d\n",
		o.concurrency, o.duration, o.maxRequests, o.runs, o.workers, b.storeDesc, runtime.GOMAXPROCS(0))
	var rows []string
	var notes []string
	for _, m := range o.modes {
		var results []result
		for i := range o.runs {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			r, err := b.runMode(ctx, m)
			if err != nil {
				return fmt.Errorf("%s run %d: %w", m, i+1, err)
			}
			fmt.Fprintf(stdout, "  %s run %d: %.0f req/s, p50 %v, p99 %v, decided locally %.1f%%, errors %d\n", m, i+1, r.rps, r.p50, r.p99, 100*r.local, r.errors)
			results = append(results, r)
		}
		med := median(results)
		ft, note, err := b.filterTime(m)
		if err != nil {
			return fmt.Errorf("%s: filter time: %w", m, err)
		}
		rows = append(rows, fmt.Sprintf("%s\t%.0f\t%v\t%v\t%.1f%%\t%s\t%d\t", m, med.rps, med.p50, med.p99, 100*med.local, ft, med.errors))
		notes = append(notes, m+": "+note)
	}
	fmt.Fprintf(stdout, "\nmedian of %d runs:\n", o.runs)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\trequests/s\tp50\tp99\tdecided locally\tfilter time/request\terrors\t")
	for _, r := range rows {
		fmt.Fprintln(tw, r)
	}
	tw.Flush()
	fmt.Fprintln(stdout, "filter time per request (filter + host ABI), by callback, mean of 20000 driven directly on one VM:")
	for _, n := range notes {
		fmt.Fprintln(stdout, "  "+n)
	}
	fmt.Fprintln(stdout, "errors: transport errors, statuses other than 200/429, and calls the filter gave up on (failure mode applied)")
	if d := b.degraded(); d > 0 {
		fmt.Fprintf(stdout, "note: %v decisions were answered by the control plane's memory store (Redis missed its deadline)\n", d)
	}
	return nil
}

// bench is the running stack.
type bench struct {
	o         *options
	redis     *stack.Redis
	cp        *stack.ControlPlane
	up        *stack.Upstream
	gwOn      *stack.Gateway // precheck on (precheck, mixed)
	gwOff     *stack.Gateway // precheck off (callout)
	client    *http.Client
	storeDesc string
}

func startBench(ctx context.Context, o *options, tmp string, stdout io.Writer) (*bench, error) {
	b := &bench{o: o}
	ok := false
	defer func() {
		if !ok {
			b.close()
		}
	}()
	fmt.Fprintln(stdout, "sluice-bench: building the control plane and filter.wasm ...")
	cpBin := filepath.Join(tmp, "sluice-controlplane")
	if err := stack.GoBuild(ctx, "./controlplane/cmd/sluice-controlplane", cpBin); err != nil {
		return nil, err
	}
	wasmPath := o.wasm
	if wasmPath == "" {
		wasmPath = filepath.Join(tmp, "filter.wasm")
		if err := stack.BuildWasm(ctx, wasmPath); err != nil {
			return nil, err
		}
	}
	wasm, err := os.ReadFile(wasmPath)
	if err != nil {
		return nil, err
	}
	policyFile := filepath.Join(tmp, "bench.yaml")
	if err := os.WriteFile(policyFile, []byte(benchPolicy), 0o644); err != nil {
		return nil, err
	}
	b.storeDesc = "its memory store"
	redisAddr := ""
	if o.store == "redis" {
		if b.redis, err = stack.StartRedis(ctx, tmp); err != nil {
			return nil, err
		}
		redisAddr = b.redis.Addr()
		b.storeDesc = "Redis " + redisAddr
	}
	if b.cp, err = stack.StartControlPlane(ctx, stack.ControlPlaneConfig{
		Binary: cpBin, Dir: tmp, RedisAddr: redisAddr, Policies: []string{policyFile},
		Args: []string{"-log-level", "warn"},
	}); err != nil {
		return nil, err
	}
	if b.up, err = stack.StartUpstream("127.0.0.1:0", ""); err != nil {
		return nil, err
	}
	pc := stack.PluginConfig{
		Cluster: stack.DefaultCluster, Domain: domain, Timeout: o.timeout, FailureMode: "open",
		RateLimits: []stack.RateLimit{{Actions: []stack.Action{stack.RequestHeader("x-api-key", "api_key")}}},
		Precheck:   &stack.Precheck{Enabled: true},
		Headers:    &stack.Headers{Draft10: true, RetryAfter: true},
	}
	log := slog.New(slog.DiscardHandler)
	cache := filepath.Join(tmp, "wazero-cache")
	if b.gwOn, err = stack.StartGateway(ctx, stack.GatewayConfig{
		Wasm: wasm, Plugin: pc.JSON(), Workers: o.workers, ControlPlane: b.cp.GRPCAddr(),
		Upstream: b.up.URL(), CacheDir: cache, Logger: log,
	}); err != nil {
		return nil, err
	}
	pc.Precheck = &stack.Precheck{Enabled: false}
	if b.gwOff, err = stack.StartGateway(ctx, stack.GatewayConfig{
		Wasm: wasm, Plugin: pc.JSON(), Workers: o.workers, ControlPlane: b.cp.GRPCAddr(),
		Upstream: b.up.URL(), CacheDir: cache, Logger: log,
	}); err != nil {
		return nil, err
	}
	b.client = &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			MaxIdleConns: 2 * o.concurrency, MaxIdleConnsPerHost: 2 * o.concurrency,
			IdleConnTimeout: 30 * time.Second,
		},
	}
	// Every VM learns that the flood keys are over limit: requests are
	// spread over the VMs round robin, so each key is sent to every one.
	for k := range o.keys {
		for range 2 * o.workers {
			b.send(b.gwOn, fmt.Sprintf("flood-%d", k))
		}
	}
	ok = true
	return b, nil
}

func (b *bench) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, g := range []*stack.Gateway{b.gwOn, b.gwOff} {
		if g != nil {
			g.Close(ctx)
		}
	}
	if b.up != nil {
		b.up.Close(ctx)
	}
	if b.cp != nil {
		b.cp.Stop()
	}
	if b.redis != nil {
		b.redis.Stop()
	}
}

// send sends one request with an API key and returns the status (0 on a
// transport error).
func (b *bench) send(g *stack.Gateway, key string) int {
	req, err := http.NewRequest("GET", g.URL()+"/", nil)
	if err != nil {
		return 0
	}
	req.Header.Set("x-api-key", key)
	resp, err := b.client.Do(req)
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// result is one run of one mode.
type result struct {
	rps      float64
	p50, p99 time.Duration
	local    float64 // share of requests decided by the precheck
	errors   int64   // transport errors, unexpected statuses and filter failures
}

// keyFor returns the key of request i of client w in a mode.
func (b *bench) keyFor(mode string, rng *rand.Rand) string {
	k := rng.IntN(b.o.keys)
	switch mode {
	case "precheck":
		return "flood-" + strconv.Itoa(k)
	case "callout":
		return "ok-" + strconv.Itoa(k)
	}
	if rng.IntN(10) == 0 {
		return "ok-" + strconv.Itoa(k)
	}
	return "flood-" + strconv.Itoa(k)
}

// runMode runs one mode once.
func (b *bench) runMode(ctx context.Context, mode string) (result, error) {
	g := b.gwOn
	if mode == "callout" {
		g = b.gwOff
	}
	localBefore := g.Counter("sluice.precheck_rejected")
	failBefore := g.Counter("sluice.errors")
	var sent, bad atomic.Int64
	lat := make([][]time.Duration, b.o.concurrency)
	deadline := time.Now().Add(b.o.duration)
	start := time.Now()
	var wg sync.WaitGroup
	for w := range b.o.concurrency {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), uint64(start.UnixNano())))
			l := make([]time.Duration, 0, 4096)
			for ctx.Err() == nil && time.Now().Before(deadline) && sent.Add(1) <= int64(b.o.maxRequests) {
				key := b.keyFor(mode, rng)
				t0 := time.Now()
				status := b.send(g, key)
				l = append(l, time.Since(t0))
				if status != 200 && status != 429 {
					bad.Add(1)
				}
			}
			lat[w] = l
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	all := slices.Concat(lat...)
	if len(all) == 0 {
		return result{}, errors.New("no request completed")
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	n := int64(len(all))
	return result{
		rps:    float64(n) / elapsed.Seconds(),
		p50:    all[len(all)/2].Round(time.Microsecond),
		p99:    all[len(all)*99/100].Round(time.Microsecond),
		local:  float64(g.Counter("sluice.precheck_rejected")-localBefore) / float64(n),
		errors: bad.Load() + g.Counter("sluice.errors") - failBefore,
	}, ctx.Err()
}

// median returns the run with the median requests/s.
func median(rs []result) result {
	s := slices.Clone(rs)
	sort.Slice(s, func(i, j int) bool { return s[i].rps < s[j].rps })
	return s[len(s)/2]
}

// phases are the filter's time per request, by callback group.
type phases struct {
	create   time.Duration // proxy_on_context_create
	request  time.Duration // proxy_on_request_headers
	response time.Duration // proxy_on_response_headers (local reply or upstream response)
	finish   time.Duration // proxy_on_log + proxy_on_done + proxy_on_delete
}

func (p phases) total() time.Duration { return p.create + p.request + p.response + p.finish }

func (p phases) String() string {
	r := func(d time.Duration) time.Duration { return d.Round(10 * time.Nanosecond) }
	return fmt.Sprintf("context_create %v, request_headers %v, response_headers %v, log+done+delete %v",
		r(p.create), r(p.request), r(p.response), r(p.finish))
}

// filterTime measures the filter's time per request, with the host's ABI
// calls it makes, by driving one VM's callbacks directly as the proxy does
// for each request, without sockets: proxy_on_context_create,
// proxy_on_request_headers (the precheck answers 429, or the filter sends
// the control-plane call, whose synchronous part in the host is included,
// and pauses), proxy_on_response_headers (on the local reply, or on an
// upstream response), then proxy_on_log, proxy_on_done and proxy_on_delete.
// For a callout the call's round trip is not counted, and neither is
// proxy_on_http_call_response, which the host runs when the answer
// arrives, inside the wait (decoding the answer is covered by the filter's
// unit benchmarks). It returns the total for the table and the breakdown.
func (b *bench) filterTime(mode string) (string, string, error) {
	const n = 20000
	r := func(d time.Duration) string { return d.Round(10 * time.Nanosecond).String() }
	// Streams go through each phase in batches, so that the timed callbacks
	// run back to back rather than right after a wait for the network.
	const batch = 50
	measure := func(g *stack.Gateway, key string, callout bool) (phases, error) {
		vm := g.Host.VM(0)
		hdrs := host.Headers{{":authority", "bench"}, {":path", "/"}, {":method", "GET"}, {":scheme", "http"}, {"x-api-key", key}}
		upstream := host.Headers{{":status", "200"}, {"content-type", "text/plain"}, {"content-length", "3"}}
		var sum phases
		ctx := context.Background()
		streams := make([]*host.Stream, batch)
		decisions := make([]host.Decision, batch)
		for range n / batch {
			t0 := time.Now()
			for i := range streams {
				st, err := vm.NewStream(host.StreamInfo{RemoteAddr: "127.0.0.1:40000", LocalAddr: g.Addr()})
				if err != nil {
					return phases{}, err
				}
				streams[i] = st
			}
			t1 := time.Now()
			for i, st := range streams {
				decisions[i] = st.RequestHeaders(hdrs, true)
			}
			t2 := time.Now()
			sum.create += t1.Sub(t0)
			sum.request += t2.Sub(t1)
			resps := make([]host.Headers, batch)
			for i, st := range streams {
				d := decisions[i]
				switch {
				case callout && d.Kind == host.DecisionPause:
					if d = st.Await(ctx); d.Kind != host.DecisionContinue {
						return phases{}, fmt.Errorf("callout: the filter decided %v (%v)", d.Kind, d.Err)
					}
					resps[i] = upstream
				case !callout && d.Kind == host.DecisionLocalResponse:
					resps[i] = host.LocalReplyHeaders(d.Local)
				default:
					return phases{}, fmt.Errorf("the filter decided %v (%v), not what the mode expects", d.Kind, d.Err)
				}
			}
			t3 := time.Now()
			for i, st := range streams {
				st.ResponseHeaders(resps[i], false)
			}
			t4 := time.Now()
			for _, st := range streams {
				st.Finish()
			}
			sum.response += t4.Sub(t3)
			sum.finish += time.Since(t4)
		}
		const m = n / batch * batch
		return phases{sum.create / m, sum.request / m, sum.response / m, sum.finish / m}, nil
	}
	switch mode {
	case "precheck":
		p, err := measure(b.gwOn, "flood-0", false)
		return r(p.total()), "local 429: " + p.String(), err
	case "callout":
		p, err := measure(b.gwOff, "ok-0", true)
		return r(p.total()) + " + call response", "callout, without the call response callback: " + p.String(), err
	}
	local, err := measure(b.gwOn, "flood-0", false)
	if err != nil {
		return "", "", err
	}
	callout, err := measure(b.gwOn, "ok-0", true)
	if err != nil {
		return "", "", err
	}
	mix := (9*local.total() + callout.total()) / 10
	return r(mix) + " (9:1)", "9 local 429s (" + r(local.total()) + ") to 1 callout (" + r(callout.total()) + " + call response)", nil
}

// degraded returns the control plane's decisions made on its memory store
// because Redis missed its deadline.
func (b *bench) degraded() float64 {
	s, err := stack.Scrape(b.cp.HTTPURL() + "/metrics")
	if err != nil {
		return 0
	}
	return s.Sum("sluice_store_degraded_decisions_total")
}

// splitList splits a comma-separated list, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
