package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/e2e/stack"
)

// TestControlPlaneDown is scenario 5: with the control planes hung
// (SIGSTOP: connections accepted, nothing answered) and then dead (SIGKILL:
// connections refused), each gateway applies its failure mode within the
// filter's timeout: gateway 0 guards a policy that fails open (requests go
// through), gateway 1 one that fails closed (503). Restarted, the control
// planes decide again.
func TestControlPlaneDown(t *testing.T) {
	const timeout = 150 * time.Millisecond
	// Scheduling margin on two busy cores, on top of the timeout.
	const margin = 600 * time.Millisecond
	open, closed := plugin(), plugin()
	open.Timeout, closed.Timeout = timeout.String(), timeout.String()
	open.FailureMode = "open"
	closed.FailureMode, closed.StatusOnError = "closed", 503
	c := startCluster(t, clusterConfig{
		policy: `
domain: e2e
descriptors:
  - key: api_key
    rate_limit: {name: per_key, unit: second, requests_per_unit: 1000}
`,
		plugins: []stack.PluginConfig{open, closed},
	})
	want := []int{200, 503} // per gateway: failure mode open, closed

	// Up: both decide normally, with the control plane's headers.
	for gw := range 2 {
		for range 2 { // both VMs
			r := c.send(gw, "alice")
			if r.err != nil || r.status != 200 || r.header.Get("RateLimit") == "" {
				t.Fatalf("gateway %d with the control plane up: %v status %d, RateLimit %q", gw, r.err, r.status, r.header.Get("RateLimit"))
			}
		}
	}

	check := func(phase string, minTook time.Duration) {
		t.Helper()
		for gw := range 2 {
			for i := range 4 { // each VM twice
				r := c.send(gw, "alice")
				if r.err != nil {
					t.Fatalf("%s: gateway %d: %v", phase, gw, r.err)
				}
				if r.status != want[gw] {
					t.Errorf("%s: gateway %d request %d: status %d %q, want %d", phase, gw, i, r.status, r.body, want[gw])
				}
				if r.took > timeout+margin || r.took < minTook {
					t.Errorf("%s: gateway %d request %d answered in %v, want %v..%v", phase, gw, i, r.took, minTook, timeout+margin)
				}
			}
		}
	}

	// Hung: the call waits for the timeout, then the failure mode applies.
	for _, cp := range c.cps {
		if err := cp.Freeze(); err != nil {
			t.Fatal(err)
		}
	}
	check("control planes hung (SIGSTOP)", timeout*9/10)

	// Dead: the call fails at once.
	for _, cp := range c.cps {
		cp.Kill()
	}
	check("control planes killed", 0)
	failures := c.gwCounter("sluice.failure_open") + c.gwCounter("sluice.failure_closed")
	if failures != 16 {
		t.Errorf("the filter counted %d failures (open %d, closed %d), want 16 (4 per gateway and phase)", failures,
			c.gwCounter("sluice.failure_open"), c.gwCounter("sluice.failure_closed"))
	}

	// Back: the gateways reconnect and the control planes decide again.
	for _, cp := range c.cps {
		if err := cp.Restart(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	for gw := range 2 {
		took, ok := waitFor(5*time.Second, func() bool {
			r := c.send(gw, "alice")
			return r.status == 200 && r.header.Get("RateLimit") != ""
		})
		if !ok {
			t.Fatalf("gateway %d: no decision from the restarted control plane within %v", gw, took)
		}
		t.Logf("gateway %d decides again %v after the restart", gw, took.Round(time.Millisecond))
	}
}
