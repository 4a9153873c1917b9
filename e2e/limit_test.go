package e2e

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/e2e/stack"
)

// TestLimitAcrossEnvoys is scenario 1: a limit of N per window, shared by
// two Envoys (two workers, so two Wasm VMs, each) through the control planes
// and Redis, admits N requests in total (exact algorithms), counted at the
// upstream, then answers 429 with RateLimit-Policy, RateLimit and
// Retry-After headers; a client that waits Retry-After seconds is admitted
// again.
func TestLimitAcrossEnvoys(t *testing.T) {
	stack.ForEachFilter(t, filters, func(t *testing.T, f stack.Filter) {
		const n = 8
		window := 2 * time.Second
		c := startCluster(t, clusterConfig{filter: f, policy: fmt.Sprintf(`
domain: e2e
descriptors:
  - key: api_key
    value: "log-*"
    rate_limit: {name: per_key_log, algorithm: sliding_log, window: 2s, requests_per_unit: %[1]d}
  - key: api_key
    value: "fixed-*"
    rate_limit: {name: per_key_fixed, algorithm: fixed_window, window: 2s, requests_per_unit: %[1]d}
`, n)})

		for _, tc := range []struct {
			algorithm string
			key       string
			policy    string
			aligned   bool // windows start at multiples of the window (fixed_window)
		}{
			{"sliding_log", "log-alice", "per_key_log", false},
			{"fixed_window", "fixed-bob", "per_key_fixed", true},
		} {
			t.Run(tc.algorithm, func(t *testing.T) {
				if tc.aligned {
					// The burst must fall in one window: start it early in one,
					// which also leaves Retry-After well above a second. This
					// waits for a real window boundary (at most 2 s).
					now := time.Now()
					if into := now.Sub(now.Truncate(window)); into > window/8 {
						time.Sleep(window - into + 20*time.Millisecond)
					}
				}
				degradedBefore := c.cpMetric("sluice_store_degraded_decisions_total")

				// The burst: 2N requests, alternating between the Envoys and
				// between their VMs: each VM's precheck knows only what it saw.
				var admitted, rejected int
				for i := range 2 * n {
					gw, vm := i%2, (i/2)%workers
					r := c.sendVM(gw, vm, tc.key)
					if r.err != nil {
						t.Fatalf("request %d via Envoy %d, VM %d: %v", i, gw, vm, r.err)
					}
					switch r.status {
					case 200:
						if rejected > 0 {
							t.Errorf("request %d via Envoy %d, VM %d admitted after a rejection", i, gw, vm)
						}
						admitted++
						checkAdmitted(t, r, tc.policy, n, n-admitted)
					case 429:
						rejected++
						checkRejected(t, r, tc.policy, n, window)
					default:
						t.Fatalf("request %d via Envoy %d, VM %d: status %d %q", i, gw, vm, r.status, r.body)
					}
				}
				if admitted != n {
					t.Errorf("the two Envoys admitted %d requests of a limit of %d per %v; %s", admitted, n, window, c.filterErrors())
				}
				if got := c.up.ByKey(tc.key); got != int64(n) {
					t.Errorf("the upstream saw %d requests for %s, want the limit, %d (the Envoys answered 200 %d times)", got, tc.key, n, admitted)
				}
				if d := c.cpMetric("sluice_store_degraded_decisions_total") - degradedBefore; d != 0 {
					t.Errorf("%v decisions were made degraded (memory store): counts are per replica then", d)
				}

				// A client acting on Retry-After, on each Envoy in turn: a
				// rejected request is admitted once it has waited as long as
				// Retry-After said (nothing else uses the key meanwhile), by the
				// VM that rejected it (whose precheck remembers the refusal).
				for gw := range 2 {
					r := c.sendVM(gw, 0, tc.key)
					if r.status == 200 {
						continue // the window has moved on already
					}
					if r.status != 429 {
						t.Fatalf("Envoy %d: status %d %q", gw, r.status, r.body)
					}
					ra, err := strconv.Atoi(r.header.Get("Retry-After"))
					if err != nil {
						t.Fatalf("Envoy %d: Retry-After %q: %v", gw, r.header.Get("Retry-After"), err)
					}
					time.Sleep(time.Until(r.at.Add(time.Duration(ra) * time.Second)))
					if r2 := c.sendVM(gw, 0, tc.key); r2.status != 200 {
						t.Errorf("Envoy %d: after waiting Retry-After (%d s): status %d, Retry-After %q, RateLimit %q",
							gw, ra, r2.status, r2.header.Get("Retry-After"), r2.header.Get("RateLimit"))
					}
				}
			})
		}
	})
}

// checkAdmitted checks the headers of an admitted response: the policy and
// what remains.
func checkAdmitted(t *testing.T, r reply, policy string, quota, remaining int) {
	t.Helper()
	pol := oneItem(t, r, "RateLimit-Policy", policy)
	if pol.params["q"] != int64(quota) {
		t.Errorf("RateLimit-Policy %q: q should be %d", r.header.Get("RateLimit-Policy"), quota)
	}
	rl := oneItem(t, r, "RateLimit", policy)
	if rl.params["r"] != int64(remaining) {
		t.Errorf("RateLimit %q: r should be %d", r.header.Get("RateLimit"), remaining)
	}
	if r.header.Get("Retry-After") != "" {
		t.Errorf("an admitted response has Retry-After %q", r.header.Get("Retry-After"))
	}
}

// checkRejected checks a 429: the policy (quota and window), nothing
// remaining, a reset and a Retry-After within the window.
func checkRejected(t *testing.T, r reply, policy string, quota int, window time.Duration) {
	t.Helper()
	w := int64(window / time.Second)
	pol := oneItem(t, r, "RateLimit-Policy", policy)
	if pol.params["q"] != int64(quota) || pol.params["w"] != w {
		t.Errorf("RateLimit-Policy %q: want q=%d;w=%d", r.header.Get("RateLimit-Policy"), quota, w)
	}
	rl := oneItem(t, r, "RateLimit", policy)
	if rl.params["r"] != 0 || rl.params["t"] < 1 || rl.params["t"] > w {
		t.Errorf("RateLimit %q: want r=0 and 1 <= t <= %d", r.header.Get("RateLimit"), w)
	}
	ra, err := strconv.Atoi(r.header.Get("Retry-After"))
	if err != nil || ra < 1 || int64(ra) > w {
		t.Errorf("Retry-After %q: want whole seconds in [1, %d]", r.header.Get("Retry-After"), w)
	}
}

// oneItem returns the single member of a structured-field list header,
// and checks that it names policy (what the control plane calls the limit).
func oneItem(t *testing.T, r reply, header, policy string) sfItem {
	t.Helper()
	vals := r.header.Values(header)
	if len(vals) != 1 {
		t.Fatalf("status %d: %d %s fields %q, want 1", r.status, len(vals), header, vals)
	}
	items, err := parseSFList(vals[0])
	if err != nil {
		t.Fatalf("%s: %v", header, err)
	}
	if len(items) != 1 {
		t.Fatalf("%s %q: want one member", header, vals[0])
	}
	if items[0].name != policy {
		t.Errorf("status %d (%s): %s %q names the limit %q; the control plane calls it %q",
			r.status, decidedBy(r), header, vals[0], items[0].name, policy)
	}
	return items[0]
}

// decidedBy says who decided a response, from the filter's local reply
// body and the upstream's.
func decidedBy(r reply) string {
	switch {
	case r.status == 200:
		return "control plane, admitted"
	case r.status == 429:
		return "429 body " + strconv.Quote(r.body)
	}
	return "status " + strconv.Itoa(r.status)
}
