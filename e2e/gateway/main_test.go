package gateway

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluicehq/sluice/e2e/stack"
)

// Binaries TestMain builds, each named ratelimit (Envoy Gateway runs
// /bin/ratelimit).
var sluiceBin, peerBin string

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if testing.Short() {
		fmt.Println("e2e/gateway: skipped in -short mode (its tests start Envoy, Redis and rate limit services)")
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "sluice-gateway-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e/gateway:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	for _, d := range []string{"sluice", "peer"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			fmt.Fprintln(os.Stderr, "e2e/gateway:", err)
			return 1
		}
	}
	// sluice's binary under the name ratelimit, as the image would ship it.
	sluiceBin = filepath.Join(dir, "sluice", "ratelimit")
	if err := stack.GoBuild(ctx, "./controlplane/cmd/sluice-controlplane", sluiceBin); err != nil {
		fmt.Fprintln(os.Stderr, "e2e/gateway: build sluice:", err)
		return 1
	}
	root, err := stack.ModuleRoot(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e/gateway:", err)
		return 1
	}
	peerBin = filepath.Join(dir, "peer", "ratelimit")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", peerBin, ".")
	cmd.Dir = filepath.Join(root, "bench", "ratelimit-peer")
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e/gateway: build envoyproxy/ratelimit (bench/ratelimit-peer): %v\n%s", err, out)
		return 1
	}
	return m.Run()
}
