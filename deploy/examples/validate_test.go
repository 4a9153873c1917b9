package examples

import (
	"context"
	"os"
	"os/exec"
	"time"
)

// runValidate runs `envoy --mode validate -c path`, with env added to
// Envoy's environment.
func runValidate(envoy, path string, env ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, envoy, "--mode", "validate", "-c", path, "--disable-hot-restart", "--log-level", "warn")
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}
