package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/e2e/stack"
)

// livePolicy is the policy of the ratectl scenarios, with a limit of n per
// minute per api key.
func livePolicy(n int) string {
	return fmt.Sprintf(`
domain: e2e
descriptors:
  - key: api_key
    rate_limit: {name: per_key, algorithm: sliding_log, unit: minute, requests_per_unit: %d}
`, n)
}

// TestApplyLowersLimit is scenario 3: `ratectl apply` on one control plane
// lowers a limit, and both Envoys (each behind its own control plane)
// enforce the new limit within 2 s on every worker's VM, with nothing
// restarted.
func TestApplyLowersLimit(t *testing.T) {
	stack.ForEachFilter(t, filters, func(t *testing.T, f stack.Filter) {
		const before, after = 100, 5
		// The policy file only seeds the store, so that ratectl owns the
		// domain (a file's own domain refuses ratectl).
		c := startCluster(t, clusterConfig{filter: f, policy: livePolicy(before), cpArgs: []string{"-policy-seed-only"}})
		for i := range 2 * 2 * workers {
			gw, vm := i%2, (i/2)%workers
			if r := c.sendVM(gw, vm, "steady"); r.status != 200 || quota(r) != before {
				t.Fatalf("before the apply: Envoy %d, VM %d: %v status %d, RateLimit-Policy %q", gw, vm, r.err, r.status, r.header.Get("RateLimit-Policy"))
			}
		}

		file := c.writeFile("lowered.yaml", livePolicy(after))
		out, errOut, code := c.ratectl(0, "apply", "-f", file)
		if code != 0 {
			t.Fatalf("ratectl apply: exit %d\n%s%s", code, out, errOut)
		}
		applied := time.Now()

		// Each VM of each Envoy enforces the new limit once the control plane
		// its Envoy asks reports it (control plane 1 learns it through Redis).
		for gw := range 2 {
			for vm := range workers {
				_, ok := waitFor(5*time.Second, func() bool {
					return quota(c.sendVM(gw, vm, "steady")) == after
				})
				took := time.Since(applied)
				if !ok {
					t.Fatalf("Envoy %d, VM %d: still not on the new limit %v after ratectl apply", gw, vm, took)
				}
				t.Logf("Envoy %d, VM %d enforces the new limit %v after ratectl apply returned", gw, vm, took.Round(time.Millisecond))
				if took > 2*time.Second {
					t.Errorf("Envoy %d, VM %d took %v to enforce the new limit, want <= 2s", gw, vm, took)
				}
			}
		}

		// The new limit holds across both Envoys and all their VMs for a key
		// not seen before, counted at the upstream.
		admitted := 0
		for i := range after + 3 {
			gw, vm := i%2, (i/2)%workers
			r := c.sendVM(gw, vm, "fresh")
			switch r.status {
			case 200:
				admitted++
			case 429:
			default:
				t.Fatalf("Envoy %d, VM %d: %v status %d %q", gw, vm, r.err, r.status, r.body)
			}
		}
		if admitted != after || c.up.ByKey("fresh") != after {
			t.Errorf("after the apply a new key was admitted %d times (the upstream saw %d), want %d; %s",
				admitted, c.up.ByKey("fresh"), after, c.filterErrors())
		}
	})
}

// TestBadPolicyRefused is scenario 6, second half: ratectl apply of an
// invalid policy is refused with an error naming what to fix, and nothing
// changes: the stored policy, its version, and the decisions.
func TestBadPolicyRefused(t *testing.T) {
	stack.ForEachFilter(t, filters, func(t *testing.T, f stack.Filter) {
		const n = 4
		c := startCluster(t, clusterConfig{filter: f, policy: livePolicy(n)})
		getBefore, errOut, code := c.ratectl(0, "get", domain, "-o", "json")
		if code != 0 {
			t.Fatalf("ratectl get: exit %d: %s", code, errOut)
		}

		for _, tc := range []struct {
			name   string
			policy string
			want   []string // in ratectl's error
		}{
			{"negative limit", strings.Replace(livePolicy(n), "requests_per_unit: 4", "requests_per_unit: -5", 1), []string{"requests_per_unit"}},
			{"unknown algorithm", strings.Replace(livePolicy(n), "sliding_log", "leaky_bucket", 1), []string{"algorithm", "leaky_bucket"}},
			{"misspelt field", strings.Replace(livePolicy(n), "requests_per_unit", "request_per_unit", 1), []string{"request_per_unit"}},
			{"not YAML", "domain: e2e\ndescriptors: [\n", []string{"yaml"}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				file := c.writeFile("bad.yaml", tc.policy)
				out, errOut, code := c.ratectl(0, "apply", "-f", file)
				if code != 1 {
					t.Errorf("ratectl apply of a bad policy: exit %d, want 1\n%s%s", code, out, errOut)
				}
				for _, w := range tc.want {
					if !strings.Contains(strings.ToLower(errOut), strings.ToLower(w)) {
						t.Errorf("the error does not name %q:\n%s", w, errOut)
					}
				}
			})
		}

		// Nothing changed: the stored policy and version on both control
		// planes, and the limit the Envoys enforce.
		for cp := range 2 {
			got, errOut, code := c.ratectl(cp, "get", domain, "-o", "json")
			if code != 0 {
				t.Fatalf("ratectl get on control plane %d: exit %d: %s", cp, code, errOut)
			}
			if got != getBefore {
				t.Errorf("control plane %d: the policy changed:\nbefore %s\nafter  %s", cp, getBefore, got)
			}
		}
		admitted := 0
		for i := range n + 2 {
			r := c.sendVM(i%2, (i/2)%workers, "unchanged")
			if r.status == 200 {
				admitted++
			}
		}
		if admitted != n {
			t.Errorf("after the refused applies a new key was admitted %d times, want %d; %s", admitted, n, c.filterErrors())
		}
	})
}
