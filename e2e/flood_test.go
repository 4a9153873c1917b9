package e2e

import (
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/e2e/stack"
)

// TestFloodDecidedLocally is scenario 2: a flood of ten times the limit on
// one key, through both Envoys at once, on two connections per worker (so
// every Wasm VM sees a share). The limit still admits exactly N, counted at
// the upstream, and at least 90% of the rejected requests are decided by the
// filter's precheck (over-limit cache and local bucket) without reaching a
// control plane. The filter's counters in Envoy's /stats
// (wasmcustom.sluice.*) report the same split as the control planes'
// /metrics: every call the filters made is a decision the control planes
// counted, and the other rejections never reached them.
//
// The VMs of one Envoy share what they learn of over-limit keys (package
// filter/proxywasm/shareddata), and Envoy's access log shows each of them shedding
// its own share (response code details).
func TestFloodDecidedLocally(t *testing.T) {
	stack.ForEachFilter(t, filters, func(t *testing.T, f stack.Filter) {
		const (
			n         = 50     // the limit
			flood     = 10 * n // requests sent
			perWorker = 2      // connections per worker and Envoy: 8 clients at once
			key       = "flood-mallory"
		)
		c := startCluster(t, clusterConfig{filter: f, policy: fmt.Sprintf(`
domain: e2e
descriptors:
  - key: api_key
    value: "flood-*"
    rate_limit: {name: flood, algorithm: sliding_log, window: 1m, requests_per_unit: %d}
`, n)})
		var conns []*stack.WorkerConn
		for gw := range c.envoys {
			conns = append(conns, c.moreConns(gw, perWorker)...)
		}

		okBefore := c.cpMetric("sluice_rls_decisions_total", "domain", domain, "code", "OK")
		overBefore := c.cpMetric("sluice_rls_decisions_total", "domain", domain, "code", "OVER_LIMIT")
		degradedBefore := c.cpMetric("sluice_store_degraded_decisions_total")
		filterBefore := c.filterCounters()
		envoyBefore := c.envoyCounts()

		// Each connection sends its share of the flood, so each VM sends a
		// quarter of it, however fast its Envoy and control plane answer.
		start := time.Now()
		var admitted, rejected atomic.Int64
		errs := make(chan error, len(conns))
		var wg sync.WaitGroup
		for i, wc := range conns {
			share := flood / len(conns)
			if i < flood%len(conns) {
				share++
			}
			wg.Go(func() {
				for range share {
					r := c.sendOn(wc, key)
					switch {
					case r.err != nil:
						errs <- r.err
						return
					case r.status == 200:
						admitted.Add(1)
					case r.status == 429:
						rejected.Add(1)
					default:
						errs <- fmt.Errorf("VM %d: status %d %q", wc.Worker, r.status, r.body)
						return
					}
				}
			})
		}
		wg.Wait()
		took := time.Since(start)
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}

		okCalls := c.cpMetric("sluice_rls_decisions_total", "domain", domain, "code", "OK") - okBefore
		overCalls := c.cpMetric("sluice_rls_decisions_total", "domain", domain, "code", "OVER_LIMIT") - overBefore
		if d := c.cpMetric("sluice_store_degraded_decisions_total") - degradedBefore; d != 0 {
			t.Errorf("%v decisions were made degraded (memory store): counts are per replica then", d)
		}
		a, r := admitted.Load(), rejected.Load()
		if a != n || a+r != flood {
			t.Errorf("%d requests: %d admitted, %d rejected; want exactly %d admitted; %s", flood, a, r, n, c.filterErrors())
		}
		if got := c.up.ByKey(key); got != n {
			t.Errorf("the upstream saw %d requests, want the limit, %d (the Envoys answered 200 %d times)", got, n, a)
		}
		if int64(okCalls) != a {
			t.Errorf("the control planes admitted %v requests, the Envoys %d", okCalls, a)
		}
		local := r - int64(overCalls)
		share := float64(local) / float64(r)
		t.Logf("%d requests in %v through %d VMs: %d admitted, %d rejected, %d of them in the filter (%.1f%%); control planes: %v OK, %v OVER_LIMIT",
			flood, took.Round(time.Millisecond), 2*workers, a, r, local, 100*share, okCalls, overCalls)
		if share < 0.9 {
			t.Errorf("only %.1f%% of the rejections were decided in the filter, want >= 90%%", 100*share)
		}
		// The filter's counters in Envoy's /stats tell the same story.
		fc := c.filterCounters().minus(filterBefore)
		t.Logf("filter counters (both Envoys): %+v", fc)
		if fc.allowed != a || fc.overLimit != int64(overCalls) || fc.precheckRejected != local || fc.errors != 0 {
			t.Errorf("filter counters %+v; the control planes' metrics say allowed %v, over_limit %v, and so precheck_rejected %d, errors 0",
				fc, okCalls, overCalls, local)
		}
		// And so does Envoy's access log, which names who decided each
		// request, per VM: every VM learns that the key is over its limit (from
		// a control plane's refusal, its own or another VM's through the shared
		// data, or from what it alone admitted), then sheds the rest of its
		// share itself. Until the first refusal reaches it, each of its
		// connections may have one more request at a control plane.
		logs, err := c.accessLogs(key, flood)
		if err != nil {
			t.Fatal(err)
		}
		byDetails := map[string]int64{}
		for gw := range logs {
			perVM := map[string]map[string]int{}
			for _, e := range logs[gw] {
				byDetails[e.details]++
				if perVM[e.vm] == nil {
					perVM[e.vm] = map[string]int{}
				}
				perVM[e.vm][e.details]++
			}
			for vm := range workers {
				d := perVM[strconv.Itoa(vm)]
				t.Logf("Envoy %d, VM %d: %d admitted, %d rejected by the control plane, %d by the precheck",
					gw, vm, d["via_upstream"], d["sluice_over_limit"], d["sluice_precheck_over_limit"])
				if d["sluice_over_limit"] > perWorker || d["sluice_precheck_over_limit"] < 1 {
					t.Errorf("Envoy %d, VM %d: the control plane refused %d requests and the precheck %d; want at most %d and at least 1",
						gw, vm, d["sluice_over_limit"], d["sluice_precheck_over_limit"], perWorker)
				}
			}
		}
		if byDetails["via_upstream"] != a || byDetails["sluice_over_limit"] != int64(overCalls) || byDetails["sluice_precheck_over_limit"] != local || len(byDetails) != 3 {
			t.Errorf("the access logs say %v; want via_upstream %d, sluice_over_limit %v, sluice_precheck_over_limit %d", byDetails, a, overCalls, local)
		}

		// And so do Envoy's counters: the answers it sent, the requests it
		// forwarded upstream, and the calls it made to the control planes.
		e := c.envoyCounts().minus(envoyBefore)
		t.Logf("Envoy counters (both): %+v", e)
		if e.rq2xx != a || e.rq4xx != r || e.rq5xx != 0 || e.upstreamRq != a || e.cpRq != int64(okCalls+overCalls) {
			t.Errorf("Envoy counted %+v; want %d 2xx and upstream requests, %d 4xx, no 5xx, %v control-plane calls",
				e, a, r, okCalls+overCalls)
		}
	})
}

// envoyCounts are some of Envoy's own counters, summed over both Envoys.
type envoyCounts struct {
	rq2xx, rq4xx, rq5xx int64 // answers on the listener
	upstreamRq          int64 // requests forwarded to the upstream
	cpRq, cpTimeout     int64 // calls to the control plane, and those that timed out
}

// envoyCounts reads Envoy's counters from both Envoys' /stats.
func (c *cluster) envoyCounts() envoyCounts {
	return envoyCounts{
		rq2xx:      c.envoyStat("http." + c.listener + ".downstream_rq_2xx"),
		rq4xx:      c.envoyStat("http." + c.listener + ".downstream_rq_4xx"),
		rq5xx:      c.envoyStat("http." + c.listener + ".downstream_rq_5xx"),
		upstreamRq: c.envoyStat("cluster.upstream.upstream_rq_total"),
		cpRq:       c.envoyStat("cluster." + stack.DefaultCluster + ".upstream_rq_total"),
		cpTimeout:  c.envoyStat("cluster." + stack.DefaultCluster + ".upstream_rq_timeout"),
	}
}

// minus returns the counts since b.
func (e envoyCounts) minus(b envoyCounts) envoyCounts {
	return envoyCounts{e.rq2xx - b.rq2xx, e.rq4xx - b.rq4xx, e.rq5xx - b.rq5xx,
		e.upstreamRq - b.upstreamRq, e.cpRq - b.cpRq, e.cpTimeout - b.cpTimeout}
}

// filterCounts are the filter's counters, summed over both Envoys.
type filterCounts struct {
	allowed, overLimit, precheckRejected, errors, failureOpen, failureClosed int64
}

// filterCounters reads the filter's counters from both Envoys' /stats.
func (c *cluster) filterCounters() filterCounts {
	return filterCounts{
		allowed:          c.gwCounter("sluice.allowed"),
		overLimit:        c.gwCounter("sluice.over_limit"),
		precheckRejected: c.gwCounter("sluice.precheck_rejected"),
		errors:           c.gwCounter("sluice.errors"),
		failureOpen:      c.gwCounter("sluice.failure_open"),
		failureClosed:    c.gwCounter("sluice.failure_closed"),
	}
}

// minus returns the counts since b.
func (f filterCounts) minus(b filterCounts) filterCounts {
	return filterCounts{
		f.allowed - b.allowed, f.overLimit - b.overLimit, f.precheckRejected - b.precheckRejected,
		f.errors - b.errors, f.failureOpen - b.failureOpen, f.failureClosed - b.failureClosed,
	}
}
