// Package rlqs tests sluice's Rate Limit Quota Service with real processes:
// Envoy's own rate_limit_quota filter, sluice-controlplane and redis-server.
package rlqs

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluicehq/sluice/e2e/stack"
)

// controlPlane is the sluice-controlplane binary TestMain builds.
var controlPlane string

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(runTests(m))
}

// runTests builds sluice-controlplane and runs the tests.
func runTests(m *testing.M) int {
	if testing.Short() {
		fmt.Println("e2e/rlqs: skipped in -short mode (starts Envoys, control planes and Redis)")
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "sluice-rlqs-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e/rlqs:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	controlPlane = filepath.Join(dir, "sluice-controlplane")
	if err := stack.GoBuild(ctx, "./controlplane/cmd/sluice-controlplane", controlPlane); err != nil {
		fmt.Fprintln(os.Stderr, "e2e/rlqs: build:", err)
		return 1
	}
	return m.Run()
}
