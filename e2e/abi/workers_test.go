package abi

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/e2e/stack"
)

// floodPolicy: 5 per second per tenant, in fixed one-second windows: a
// flood of a few seconds crosses several windows, and in each one the
// filter must learn again that the tenant is over its limit.
const floodPolicy = `
domain: abi
descriptors:
  - key: tenant
    rate_limit: {algorithm: fixed_window, unit: second, requests_per_unit: 5}
`

// flood is what one run of TestPerWorkerPrecheck saw.
type flood struct {
	workers                                      int
	sent, ok, limited                            int64
	allowed, overLimit, precheck, errs, failOpen int64
	shared                                       int64   // precheck rejections on a block another VM learnt
	casRetries, lost                             int64   // shared writes that lost the CAS and retried; blocks not shared
	perWorker                                    []int64 // connections each worker accepted
}

// localShare is the share of the rejected requests that the precheck
// rejected without asking the control plane.
func (f flood) localShare() float64 {
	if f.limited == 0 {
		return 0
	}
	return float64(f.precheck) / float64(f.limited)
}

// overPerRequest is the calls the control plane answered OVER_LIMIT per
// request sent: the calls a precheck that knew everything the proxy had
// learnt would have saved (admitted requests call once each at any number
// of workers, so they are counted apart).
func (f flood) overPerRequest() float64 { return float64(f.overLimit) / float64(f.sent) }

// floodWorkers returns the worker counts TestPerWorkerPrecheck compares:
// 1, 2 and 4, or 1 and those of $SLUICE_FLOOD_WORKERS ("8": 8 workers on
// this 2-core machine take too long for make test).
func floodWorkers(t *testing.T) []int {
	s := os.Getenv("SLUICE_FLOOD_WORKERS")
	if s == "" {
		return []int{1, 2, 4}
	}
	out := []int{1}
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 2 || n > 64 {
			t.Fatalf("SLUICE_FLOOD_WORKERS=%q: worker counts from 2 to 64", s)
		}
		out = append(out, n)
	}
	return out
}

// TestPerWorkerPrecheck floods one tenant at 10x its limit (50 requests a
// second for 6 s, paced, from 16 keep-alive connections that the kernel
// spreads over the workers) through Envoy with 1, 2 and 4 workers. Each
// worker runs its own VM; the VMs of one Envoy share the over-limit blocks
// through proxy-wasm shared data, so a denial one VM hears from the control
// plane is the others' too, and the calls the control plane answers
// OVER_LIMIT, per request, do not grow with the workers: at 4 workers at
// most 1.25x those at 1. (With per-VM state every VM that serves the flood
// paid one such call per window.) What remains per window: the requests in
// flight when the limit is reached, and those of the window's last call
// timeout, when the blocks end so as never to reject what the control plane
// would allow. The control plane admits every request that passes.
//
// On each host: filter.wasm shares the blocks through proxy-wasm shared
// data, the native module through process memory.
func TestPerWorkerPrecheck(t *testing.T) {
	progs, _ := programs(t)
	stack.ForEachFilter(t, progs.Filters, func(t *testing.T, flt stack.Filter) { perWorkerPrecheckOn(t, progs, flt) })
}

// perWorkerPrecheckOn is TestPerWorkerPrecheck on filter flt.
func perWorkerPrecheckOn(t *testing.T, progs stack.Programs, flt stack.Filter) {
	ctx := context.Background()
	dir := t.TempDir()
	cp, up := backends(t, ctx, progs, dir, floodPolicy)
	plugin := stack.PluginConfig{Cluster: stack.DefaultCluster, Domain: "abi", Timeout: "50ms", FailureMode: "closed",
		RateLimits: []stack.RateLimit{{Actions: []stack.Action{stack.RequestHeader("x-tenant", "tenant")}}},
		Precheck:   &stack.Precheck{Enabled: true}}

	const rate, seconds, clients = 50, 6, 16
	const requests = rate * seconds
	counts := floodWorkers(t)
	runs := map[int]int{} // floods run at each worker count
	// flooded floods the proxy with workers workers once, and checks what
	// holds in every flood.
	flooded := func(workers int) flood {
		run := runs[workers]
		runs[workers]++
		e, err := stack.StartEnvoy(ctx, stack.EnvoyConfig{Dir: dir, Name: fmt.Sprintf("envoy-%s-%d-%d", flt.Host.Name, workers, run), Concurrency: workers,
			Bootstrap: stack.Bootstrap(
				[]stack.M{stack.HTTPListener("in", 0, []stack.M{stack.VirtualHost("all", stack.RouteTo("/", "up"))},
					flt.HTTPFilter("sluice", plugin.JSON()))},
				[]stack.M{stack.Cluster("up", up.Addr()), stack.GRPCCluster(stack.DefaultCluster, cp.GRPCAddr())})})
		if err != nil {
			t.Fatal(err)
		}
		f := flood{workers: workers, sent: requests}
		tenant := fmt.Sprintf("t%d-%d", workers, run)
		var ok, limited, failed atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for c := range clients {
			wg.Add(1)
			go func() { // one connection each: the kernel spreads them over the workers
				defer wg.Done()
				client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
				defer client.CloseIdleConnections()
				// Request n of the flood is due at start + n/rate; this
				// client sends every clients-th one.
				for n := c; n < requests; n += clients {
					time.Sleep(time.Until(start.Add(time.Duration(n) * time.Second / rate)))
					req, _ := http.NewRequest("GET", e.URL("in")+"/", nil)
					req.Header.Set("x-tenant", tenant)
					resp, err := client.Do(req)
					if err != nil {
						t.Error(err)
						return
					}
					io.Copy(io.Discard, resp.Body) // so the connection is reused
					resp.Body.Close()
					switch resp.StatusCode {
					case 200:
						ok.Add(1)
					case 429:
						limited.Add(1)
					default:
						failed.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		s := counters(t, e)
		e.Stop()
		f.ok, f.limited = ok.Load(), limited.Load()
		f.allowed, f.overLimit, f.precheck = s[flt.Stat("sluice.allowed")], s[flt.Stat("sluice.over_limit")], s[flt.Stat("sluice.precheck_rejected")]
		f.errs, f.failOpen = s[flt.Stat("sluice.errors")], s[flt.Stat("sluice.failure_open")]
		f.shared = s[flt.Stat("sluice.precheck_shared")]
		f.casRetries, f.lost = s[flt.Stat("sluice.shared_cas_retries")], s[flt.Stat("sluice.shared_lost")]
		for w := range workers {
			for name, v := range s {
				if strings.HasPrefix(name, "listener.127.0.0.1_") && strings.HasSuffix(name, fmt.Sprintf(".worker_%d.downstream_cx_total", w)) {
					f.perWorker = append(f.perWorker, v)
				}
			}
		}
		t.Logf("%d workers: %d requests in %.1fs -> %d x 200, %d x 429, %d other; control plane calls %d (allowed %d, "+
			"over_limit %d: %.3f per request), precheck rejected %d (%d on blocks from another VM): %.0f%% of the 429s "+
			"shed locally; errors %d; shared writes: %d CAS retries, %d lost; connections per worker %v",
			workers, f.sent, time.Since(start).Seconds(), f.ok, f.limited, failed.Load(), f.allowed+f.overLimit, f.allowed,
			f.overLimit, f.overPerRequest(), f.precheck, f.shared, 100*f.localShare(), f.errs, f.casRetries, f.lost, f.perWorker)

		// A call that times out on a busy machine fails open (the policy's
		// failure mode): that request passes without the control plane.
		if f.ok != f.allowed+f.failOpen {
			t.Errorf("%d workers: %d answered 200 but the control plane allowed %d (and %d failed open)", workers, f.ok, f.allowed, f.failOpen)
		}
		if f.errs == 0 && (f.limited != f.overLimit+f.precheck || f.ok+f.limited != requests) {
			t.Errorf("%d workers: 429s %d != over_limit %d + precheck %d", workers, f.limited, f.overLimit, f.precheck)
		}
		if f.precheck == 0 {
			t.Errorf("%d workers: the precheck shed nothing", workers)
		}
		active := 0
		for _, n := range f.perWorker {
			if n > 0 {
				active++
			}
		}
		if active > 1 && f.shared == 0 {
			t.Errorf("%d workers: %d VMs served the flood, none rejected on a block another one learnt", workers, active)
		}
		return f
	}
	floods := map[int]flood{}
	for _, workers := range counts {
		floods[workers] = flooded(workers)
	}
	// The goal is 1.25x. The counts are small (20-25 OVER_LIMIT calls a
	// flood: the calls in flight when a window fills, and those of its last
	// call timeout) and vary by about 4 from one flood to the next at any
	// worker count, so the assertion allows 4 calls of noise on top. Per-VM
	// state made 37 and 41 at 4 workers against 23 and 24 at 1: past it.
	// A busy machine stretches some floods' calls (more of them in flight
	// when a window fills) and not others: a comparison past the bound
	// takes a second flood at both worker counts, and compares the two
	// floods of each together.
	const noise = 4.0
	within := func(f, one flood) bool { return f.overPerRequest() <= 1.25*one.overPerRequest()+noise/requests }
	pooled := func(a, b flood) flood {
		a.sent += b.sent
		a.overLimit += b.overLimit
		return a
	}
	for _, workers := range counts[1:] {
		one, f := floods[1], floods[workers]
		if !within(f, one) {
			t.Logf("%d workers: %.3f calls answered OVER_LIMIT per request against %.3f at 1 worker: a second flood of each", workers, f.overPerRequest(), one.overPerRequest())
			one, f = pooled(one, flooded(1)), pooled(f, flooded(workers))
			floods[1] = one
		}
		ratio := f.overPerRequest() / one.overPerRequest()
		t.Logf("over_limit calls per request at %d workers / at 1 worker: %.2f", workers, ratio)
		if !within(f, one) {
			t.Errorf("%d workers: %.3f calls answered OVER_LIMIT per request, %.2fx the %.3f at 1 worker (at most 1.25x, and %v calls of noise)",
				workers, f.overPerRequest(), ratio, one.overPerRequest(), noise)
		}
	}
}
