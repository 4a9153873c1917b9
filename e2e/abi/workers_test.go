package abi

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sluicehq/sluice/e2e/stack"
)

// floodPolicy: 20 per hour per tenant, exactly (sliding_log: no window
// edge inside a test can admit more).
const floodPolicy = `
domain: abi
descriptors:
  - key: tenant
    rate_limit: {algorithm: sliding_log, unit: hour, requests_per_unit: 20}
`

// flood is what one run of TestPerWorkerPrecheck saw.
type flood struct {
	workers                                      int
	sent, ok, limited                            int64
	allowed, overLimit, precheck, errs, failOpen int64
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

// TestPerWorkerPrecheck floods one tenant at 10x its limit through Envoy
// with 1, 2 and 4 workers. Each worker runs its own VM, and the precheck's
// state (what the control plane said, the local buckets) is per VM: every VM
// that serves the flood learns on its own that the tenant is over its limit,
// so the control plane refuses at least one call per such VM. The test logs
// the share of the flood shed locally (96-98% with 8 connections at 1, 2
// and 4 workers: the calls in flight when the limit is reached cost more
// than the VMs). The limit itself holds whatever the number of workers: the
// control plane admits exactly 20.
func TestPerWorkerPrecheck(t *testing.T) {
	progs, _ := programs(t)
	ctx := context.Background()
	dir := t.TempDir()
	cp, up := backends(t, ctx, progs, dir, floodPolicy)
	plugin := stack.PluginConfig{Cluster: stack.DefaultCluster, Domain: "abi", Timeout: "2s", FailureMode: "open",
		RateLimits: []stack.RateLimit{{Actions: []stack.Action{stack.RequestHeader("x-tenant", "tenant")}}},
		Precheck:   &stack.Precheck{Enabled: true}}

	const limit, requests, clients = 20, 200, 8
	for _, workers := range []int{1, 2, 4} {
		e, err := stack.StartEnvoy(ctx, stack.EnvoyConfig{Dir: dir, Name: fmt.Sprintf("envoy-%d", workers), Concurrency: workers,
			Bootstrap: stack.Bootstrap(
				[]stack.M{stack.HTTPListener("in", 0, []stack.M{stack.VirtualHost("all", stack.RouteTo("/", "up"))},
					stack.WasmFilter(progs.Wasm, plugin.JSON()))},
				[]stack.M{stack.Cluster("up", up.Addr()), stack.GRPCCluster(stack.DefaultCluster, cp.GRPCAddr())})})
		if err != nil {
			t.Fatal(err)
		}
		f := flood{workers: workers}
		tenant := fmt.Sprintf("t%d", workers)
		var next, ok, limited atomic.Int64
		var wg sync.WaitGroup
		for range clients {
			wg.Add(1)
			go func() { // one connection each: the kernel spreads them over the workers
				defer wg.Done()
				client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
				defer client.CloseIdleConnections()
				for next.Add(1) <= requests {
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
						t.Errorf("status %d", resp.StatusCode)
					}
				}
			}()
		}
		wg.Wait()
		s := counters(t, e)
		e.Stop()
		f.sent, f.ok, f.limited = requests, ok.Load(), limited.Load()
		f.allowed, f.overLimit, f.precheck = s["wasmcustom.sluice.allowed"], s["wasmcustom.sluice.over_limit"], s["wasmcustom.sluice.precheck_rejected"]
		f.errs, f.failOpen = s["wasmcustom.sluice.errors"], s["wasmcustom.sluice.failure_open"]
		for w := range workers {
			for name, v := range s {
				if strings.HasPrefix(name, "listener.127.0.0.1_") && strings.HasSuffix(name, fmt.Sprintf(".worker_%d.downstream_cx_total", w)) {
					f.perWorker = append(f.perWorker, v)
				}
			}
		}
		t.Logf("%d workers: %d requests -> %d x 200, %d x 429; control plane calls %d (allowed %d, over_limit %d), "+
			"precheck rejected %d: %.0f%% of the 429s shed locally; errors %d; connections per worker %v",
			workers, f.sent, f.ok, f.limited, f.allowed+f.overLimit, f.allowed, f.overLimit, f.precheck,
			100*f.localShare(), f.errs, f.perWorker)

		if f.errs != 0 {
			t.Errorf("%d workers: %d failed calls to the control plane", workers, f.errs)
		}
		if f.ok != limit || f.allowed != limit {
			t.Errorf("%d workers: %d answered 200, %d allowed by the control plane; want exactly %d", workers, f.ok, f.allowed, limit)
		}
		if f.limited != f.overLimit+f.precheck || f.ok+f.limited != requests {
			t.Errorf("%d workers: 429s %d != over_limit %d + precheck %d", workers, f.limited, f.overLimit, f.precheck)
		}
		active := int64(0)
		for _, n := range f.perWorker {
			if n > 0 {
				active++
			}
		}
		if f.overLimit < active {
			t.Errorf("%d workers: %d VMs served the flood but the control plane refused only %d calls: "+
				"each VM must learn on its own that the tenant is over", workers, active, f.overLimit)
		}
		if f.precheck == 0 {
			t.Errorf("%d workers: the precheck shed nothing", workers)
		}
	}
}
