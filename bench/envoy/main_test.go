package main

import (
	"context"
	"os/exec"
	"testing"
	"time"
)

// TestRuns runs a short bench-envoy (one run of setups 1, 2r, 2g, 4 and 6, one
// second each) so that the tool behind the bench-envoy figures cannot break
// unnoticed. It measures nothing.
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
		connections: 4, setups: "1,2r,2g,4,6", loads: "flood"})
	if err != nil {
		t.Fatal(err)
	}
}

func TestEnvoyVersion(t *testing.T) {
	if v := envoyVersion("envoy  version: 9e5580/1.40.0/Clean/RELEASE/BoringSSL\n"); v != "1.40.0" {
		t.Fatalf("envoyVersion = %q", v)
	}
}
