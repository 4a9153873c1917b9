package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"
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
// lowers a limit, and both gateways (each behind its own control plane)
// enforce the new limit within 2 s, with nothing restarted.
func TestApplyLowersLimit(t *testing.T) {
	const before, after = 100, 5
	c := startCluster(t, clusterConfig{policy: livePolicy(before)})
	for i := range 6 {
		if r := c.send(i%2, "steady"); r.status != 200 || quota(r) != before {
			t.Fatalf("before the apply: gateway %d: status %d, RateLimit-Policy %q", i%2, r.status, r.header.Get("RateLimit-Policy"))
		}
	}

	file := c.writeFile("lowered.yaml", livePolicy(after))
	out, errOut, code := c.ratectl(0, "apply", "-f", file)
	if code != 0 {
		t.Fatalf("ratectl apply: exit %d\n%s%s", code, out, errOut)
	}
	applied := time.Now()

	// Each gateway enforces the new limit once the control plane it asks
	// reports it (control plane 1 learns it through Redis).
	for gw := range 2 {
		took, ok := waitFor(5*time.Second, func() bool {
			r := c.send(gw, "steady")
			return quota(r) == after
		})
		took = time.Since(applied)
		if !ok {
			t.Fatalf("gateway %d: still not on the new limit %v after ratectl apply", gw, took)
		}
		t.Logf("gateway %d enforces the new limit %v after ratectl apply returned", gw, took.Round(time.Millisecond))
		if took > 2*time.Second {
			t.Errorf("gateway %d took %v to enforce the new limit, want <= 2s", gw, took)
		}
	}

	// The new limit holds across both gateways for a key not seen before.
	admitted := 0
	for i := range after + 3 {
		r := c.send(i%2, "fresh")
		switch r.status {
		case 200:
			admitted++
		case 429:
		default:
			t.Fatalf("gateway %d: status %d %q", i%2, r.status, r.body)
		}
	}
	if admitted != after {
		t.Errorf("after the apply a new key was admitted %d times, want %d; %s", admitted, after, c.filterErrors())
	}
}

// TestBadPolicyRefused is scenario 6, second half: ratectl apply of an
// invalid policy is refused with an error naming what to fix, and nothing
// changes: the stored policy, its version, and the decisions.
func TestBadPolicyRefused(t *testing.T) {
	const n = 4
	c := startCluster(t, clusterConfig{policy: livePolicy(n)})
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
	// planes, and the limit the gateways enforce.
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
		r := c.send(i%2, "unchanged")
		if r.status == 200 {
			admitted++
		}
	}
	if admitted != n {
		t.Errorf("after the refused applies a new key was admitted %d times, want %d; %s", admitted, n, c.filterErrors())
	}
}
