package main

import (
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/envoy"
)

// TestRuns runs a short bench-envoy (one run of setups 1, 2r, 2g, 2n, 4, 4n, 6, 6h, 7, 7n, L4 and Ls,
// one second each, and a worker sweep of 1 and 2 workers on both hosts) so that the tool behind the
// bench-envoy figures cannot break unnoticed. It measures nothing; 6h, 7 and 7n check first that
// their filter adds its rate limit headers to an admitted response.
func TestRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Envoy, Redis and the control plane")
	}
	if _, err := exec.LookPath("wrk"); err != nil {
		t.Fatal("wrk is needed (make test installs it with apt-get)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	err := run(ctx, config{runs: 1, duration: time.Second, warmup: time.Second, concurrency: 2,
		connections: 4, setups: "1,2r,2g,2n,4,4n,6,6h,7,7n,L4,Ls", loads: "flood",
		sweep: "1,2", sweepLoads: "flood", sweepHosts: "wasm,native", floodRate: 100, floodDuration: time.Second, floodConns: 4})
	if err != nil {
		t.Fatal(err)
	}
}

// TestOvershootRuns runs the overshoot table once, without the
// envoyproxy/ratelimit path (whose build TestRuns does not pay either).
func TestOvershootRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Envoy, Redis and the control plane")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if err := run(ctx, config{runs: 1, concurrency: 2, overshoot: true}); err != nil {
		t.Fatal(err)
	}
}

func TestEnvoyVersion(t *testing.T) {
	if v := envoyVersion("envoy  version: 9e5580/1.40.0/Clean/RELEASE/BoringSSL\n"); v != "1.40.0" {
		t.Fatalf("envoyVersion = %q", v)
	}
}

// TestSetPluginField: the sweep's per-VM case is the shipped envoy.yaml with
// shared_state false in its plugin configuration, and nothing else changed.
func TestSetPluginField(t *testing.T) {
	boot, err := envoy.Local{Wasm: "/x.wasm", Listen: "127.0.0.1:0", ControlPlane: "127.0.0.1:1", Backend: "127.0.0.1:2"}.Bootstrap(envoy.Config)
	if err != nil {
		t.Fatal(err)
	}
	before, _ := json.Marshal(boot)
	if err := setPluginField(boot, "shared_state", false); err != nil {
		t.Fatal(err)
	}
	after, _ := json.Marshal(boot)
	if !strings.Contains(string(after), `\"shared_state\":false`) || strings.Contains(string(before), "shared_state") {
		t.Fatalf("shared_state not set:\n%s", after)
	}
	native, err := envoy.Local{Listen: "127.0.0.1:0", ControlPlane: "127.0.0.1:1", Backend: "127.0.0.1:2"}.Bootstrap(envoy.NativeConfig)
	if err != nil {
		t.Fatal(err)
	}
	if err := setPluginField(native, "shared_state", false); err != nil {
		t.Fatal(err)
	}
	if after, _ := json.Marshal(native); !strings.Contains(string(after), `\"shared_state\":false`) {
		t.Fatalf("shared_state not set in the native filter's filter_config:\n%s", after)
	}
	if err := setPluginField(map[string]any{}, "shared_state", false); err == nil {
		t.Fatal("a bootstrap with no plugin configuration was accepted")
	}
	if _, err := parseWorkers("1,2,x"); err == nil {
		t.Fatal("-sweep 1,2,x accepted")
	}
	if w, err := parseWorkers("1, 8"); err != nil || len(w) != 2 || w[1] != 8 {
		t.Fatalf("parseWorkers: %v %v", w, err)
	}
}
