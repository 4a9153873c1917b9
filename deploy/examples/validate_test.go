package examples

import (
	"context"
	"os/exec"
	"time"
)

// runValidate runs `envoy --mode validate -c path`.
func runValidate(envoy, path string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, envoy, "--mode", "validate", "-c", path, "--disable-hot-restart", "--log-level", "warn").CombinedOutput()
	return string(out), err
}
