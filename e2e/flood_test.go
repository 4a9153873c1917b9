package e2e

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestFloodDecidedLocally is scenario 2: a flood of ten times the limit on
// one key, through both gateways at once. The limit still admits exactly N,
// and at least 90% of the rejected requests are decided by the filter's
// precheck (over-limit cache and local bucket) without reaching a control
// plane, counted from the control planes' /metrics.
func TestFloodDecidedLocally(t *testing.T) {
	const (
		n           = 50     // the limit
		flood       = 10 * n // requests sent
		concurrency = 8      // clients at once, half on each gateway
		key         = "flood-mallory"
	)
	c := startCluster(t, clusterConfig{policy: fmt.Sprintf(`
domain: e2e
descriptors:
  - key: api_key
    value: "flood-*"
    rate_limit: {name: flood, algorithm: sliding_log, window: 1m, requests_per_unit: %d}
`, n)})

	callsBefore := c.cpMetric("sluice_rls_decisions_total", "domain", domain)
	degradedBefore := c.cpMetric("sluice_store_degraded_decisions_total")

	start := time.Now()
	var next, admitted, rejected atomic.Int64
	errs := make(chan error, concurrency)
	var wg sync.WaitGroup
	for w := range concurrency {
		wg.Go(func() {
			for next.Add(1) <= flood {
				r := c.send(w%2, key)
				switch {
				case r.err != nil:
					errs <- r.err
					return
				case r.status == 200:
					admitted.Add(1)
				case r.status == 429:
					rejected.Add(1)
				default:
					errs <- fmt.Errorf("gateway %d: status %d %q", w%2, r.status, r.body)
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

	calls := c.cpMetric("sluice_rls_decisions_total", "domain", domain) - callsBefore
	if d := c.cpMetric("sluice_store_degraded_decisions_total") - degradedBefore; d != 0 {
		t.Errorf("%v decisions were made degraded (memory store): counts are per replica then", d)
	}
	a, r := admitted.Load(), rejected.Load()
	if a != n || a+r != flood {
		t.Errorf("%d requests: %d admitted, %d rejected; want exactly %d admitted; %s", flood, a, r, n, c.filterErrors())
	}
	if got := c.up.ByKey(key); got != a {
		t.Errorf("the upstream saw %d requests, the gateways admitted %d", got, a)
	}
	// Every admitted request was asked about; the other calls are
	// rejections the control planes decided.
	rejectedByCP := int64(calls) - a
	local := r - rejectedByCP
	share := float64(local) / float64(r)
	t.Logf("%d requests in %v: %d admitted, %d rejected, %d of them locally (%.1f%%); %v control-plane calls",
		flood, took.Round(time.Millisecond), a, r, local, 100*share, calls)
	if share < 0.9 {
		t.Errorf("only %.1f%% of the rejections were decided locally, want >= 90%%", 100*share)
	}
	// The filter's own counters tell the same story.
	if pre, over := c.gwCounter("sluice.precheck_rejected"), c.gwCounter("sluice.over_limit"); pre != local || over != rejectedByCP {
		t.Errorf("filter counters: precheck_rejected %d, over_limit %d; control-plane metrics say %d and %d",
			pre, over, local, rejectedByCP)
	}
}
