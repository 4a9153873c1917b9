package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/e2e/stack"
)

// TestControlPlaneDown is scenario 5: with the control planes hung
// (SIGSTOP: connections accepted, nothing answered) and then dead (SIGKILL:
// connections refused), each policy's failure mode is applied within the
// filter's timeout.
//
// One policy has a descriptor that fails closed (api_key "strict") and one
// that fails open ("lenient"). The control plane reports each descriptor's
// failure mode with its answers, and the filter remembers it, per Wasm VM;
// so once both keys have been answered on every worker's VM, requests for
// "strict" are refused (503) and requests for "lenient" pass, on both
// Envoys. The Envoys' plugin configurations are the same but for their own
// failure_mode, which only decides for descriptors the control plane has not
// described: a key never seen ("stranger") passes on Envoy 0 (open) and is
// refused on Envoy 1 (closed). Envoy's HTTP client ends each call at the
// filter's timeout (hung) or at once (refused connection); the test measures
// how long the answers took. Restarted, the control planes decide again.
func TestControlPlaneDown(t *testing.T) {
	stack.ForEachFilter(t, filters, func(t *testing.T, f stack.Filter) {
		const timeout = 300 * time.Millisecond
		// Scheduling margin on two busy cores, on top of the timeout.
		const margin = 600 * time.Millisecond
		open, closed := plugin(), plugin()
		for i, pc := range []*stack.PluginConfig{&open, &closed} {
			pc.Timeout, pc.StatusOnError = timeout.String(), 503
			pc.FailureMode = []string{"open", "closed"}[i]
		}
		c := startCluster(t, clusterConfig{filter: f,
			policy: `
domain: e2e
descriptors:
  - key: api_key
    value: strict
    failure_mode: closed
    rate_limit: {name: strict, unit: second, requests_per_unit: 1000}
  - key: api_key
    value: lenient
    failure_mode: open
    rate_limit: {name: lenient, unit: second, requests_per_unit: 1000}
`,
			plugins: []stack.PluginConfig{open, closed},
		})
		// What each key gets per Envoy with the control planes down.
		want := []struct {
			key    string
			status [2]int
		}{
			{"strict", [2]int{503, 503}},   // the policy fails closed
			{"lenient", [2]int{200, 200}},  // the policy fails open
			{"stranger", [2]int{200, 503}}, // unknown: each Envoy's failure_mode
		}

		// Up: the control planes decide, and their answers teach every VM each
		// descriptor's failure mode.
		for gw := range 2 {
			for vm := range workers {
				for _, key := range []string{"strict", "lenient"} {
					r := c.sendVM(gw, vm, key)
					if r.err != nil || r.status != 200 || !strings.HasPrefix(r.header.Get("RateLimit"), `"`+key+`";`) {
						t.Fatalf("Envoy %d, VM %d, key %s, with the control plane up: %v status %d, RateLimit %q",
							gw, vm, key, r.err, r.status, r.header.Get("RateLimit"))
					}
				}
			}
		}

		check := func(phase string, minTook time.Duration) {
			t.Helper()
			var took []time.Duration
			for gw := range 2 {
				for _, w := range want {
					for vm := range workers {
						r := c.sendVM(gw, vm, w.key)
						if r.err != nil {
							t.Fatalf("%s: Envoy %d, VM %d: %v", phase, gw, vm, r.err)
						}
						took = append(took, r.took)
						if r.status != w.status[gw] {
							t.Errorf("%s: Envoy %d, VM %d, key %s: status %d %q, want %d (%s)",
								phase, gw, vm, w.key, r.status, r.body, w.status[gw], c.filterErrors())
						}
						if r.took > timeout+margin || r.took < minTook {
							t.Errorf("%s: Envoy %d, VM %d, key %s answered in %v, want %v..%v",
								phase, gw, vm, w.key, r.took, minTook, timeout+margin)
						}
					}
				}
			}
			slices.Sort(took)
			t.Logf("%s: %d answers in %v (min) / %v (median) / %v (max); filter timeout %v",
				phase, len(took), took[0].Round(time.Microsecond), took[len(took)/2].Round(time.Microsecond),
				took[len(took)-1].Round(time.Microsecond), timeout)
		}

		// Hung: the call waits for the timeout, then the failure mode applies.
		// Envoy ends each call at the filter's timeout (its HTTP client counts
		// a timeout on the control-plane cluster).
		for _, cp := range c.cps {
			if err := cp.Freeze(); err != nil {
				t.Fatal(err)
			}
		}
		before := c.envoyCounts()
		check("control planes hung (SIGSTOP)", timeout*9/10)
		if d := c.envoyCounts().minus(before); d.cpTimeout != 6*workers || d.rq5xx != 3*workers {
			t.Errorf("Envoy counted %d control-plane calls timing out and %d 5xx answers, want %d and %d",
				d.cpTimeout, d.rq5xx, 6*workers, 3*workers)
		}

		// Dead: the call fails at once.
		for _, cp := range c.cps {
			cp.Kill()
		}
		check("control planes killed", 0)
		// Per phase and Envoy, one request per key and VM: strict refused and
		// lenient let through on both, the stranger by each Envoy's own mode.
		const wantOpen, wantClosed = 6 * workers, 6 * workers
		if o, cl := c.gwCounter("sluice.failure_open"), c.gwCounter("sluice.failure_closed"); o != wantOpen || cl != wantClosed {
			t.Errorf("the filter failed open %d times and closed %d times, want %d and %d", o, cl, wantOpen, wantClosed)
		}
		if e := c.gwCounter("sluice.errors"); e != wantOpen+wantClosed {
			t.Errorf("the filter counted %d errors, want %d (every call failed)", e, wantOpen+wantClosed)
		}
		// Envoy's access log says who answered: each refusal is the filter's
		// local reply for a failed check (its response code details), and each
		// request let through reached the upstream. With the control planes
		// up, strict and lenient were asked once per VM; down, every key once
		// per VM and phase.
		for _, w := range want {
			n := 2 * 2 * workers // two phases, two Envoys
			if w.key != "stranger" {
				n += 2 * workers // the phase with the control planes up
			}
			logs, err := c.accessLogs(w.key, n)
			if err != nil {
				t.Fatal(err)
			}
			for gw := range logs {
				refused := 0
				for _, e := range logs[gw] {
					switch {
					case e.status == 503 && e.details == "sluice_rate_limit_service_error":
						refused++
					case e.status != 200 || e.details != "via_upstream":
						t.Errorf("Envoy %d, key %s: access log says %d %s", gw, w.key, e.status, e.details)
					}
				}
				if outage := 2 * workers; w.status[gw] == 503 && refused != outage || w.status[gw] == 200 && refused != 0 {
					t.Errorf("Envoy %d, key %s: %d requests refused by the filter for its failure mode", gw, w.key, refused)
				}
			}
		}

		// Back: the Envoys reconnect and the control planes decide again.
		for _, cp := range c.cps {
			if err := cp.Restart(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		for gw := range 2 {
			for vm := range workers {
				took, ok := waitFor(5*time.Second, func() bool {
					r := c.sendVM(gw, vm, "strict")
					return r.status == 200 && r.header.Get("RateLimit") != ""
				})
				if !ok {
					t.Fatalf("Envoy %d, VM %d: no decision from the restarted control plane within %v", gw, vm, took)
				}
				t.Logf("Envoy %d, VM %d decides again %v after the restart", gw, vm, took.Round(time.Millisecond))
			}
		}
	})
}
