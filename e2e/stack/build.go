package stack

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// Programs are the stack's executables and the filter's artifacts, built
// by Build.
type Programs struct {
	ControlPlane string   // sluice-controlplane
	Ratectl      string   // ratectl
	Filters      []Filter // the filter, on each of FilterHosts
	Wasm         string   // filter.wasm (ProxyWasm's), for the proxy-wasm ABI's own tests
}

// ModuleRoot returns the directory of the sluice module (where go.mod is),
// as the go command sees it from the working directory.
func ModuleRoot(ctx context.Context) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "env", "GOMOD")
	cmd.Env = hostEnv()
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("not inside the sluice module (go env GOMOD is empty): run from the repository")
	}
	return filepath.Dir(mod), nil
}

// Build compiles sluice-controlplane and ratectl for this machine, and the
// filter on each of FilterHosts (filter.wasm with wasm-build.sh), into dir.
// The go build cache makes a second call fast.
func Build(ctx context.Context, dir string) (Programs, error) {
	p := Programs{
		ControlPlane: filepath.Join(dir, "sluice-controlplane"+exeSuffix()),
		Ratectl:      filepath.Join(dir, "ratectl"+exeSuffix()),
		Wasm:         filepath.Join(dir, ProxyWasm.File),
	}
	if err := GoBuild(ctx, "./controlplane/cmd/sluice-controlplane", p.ControlPlane); err != nil {
		return Programs{}, err
	}
	if err := GoBuild(ctx, "./controlplane/cmd/ratectl", p.Ratectl); err != nil {
		return Programs{}, err
	}
	fs, err := BuildFilters(ctx, dir)
	if err != nil {
		return Programs{}, err
	}
	p.Filters = fs
	return p, nil
}

// GoBuild builds the package pkg of the sluice module (e.g.
// "./controlplane/cmd/ratectl") for this machine into the file out.
func GoBuild(ctx context.Context, pkg, out string) error {
	root, err := ModuleRoot(ctx)
	if err != nil {
		return err
	}
	return run(ctx, root, "go", "build", "-o", out, pkg)
}

// BuildWasm builds filter.wasm into the file out with wasm-build.sh.
func BuildWasm(ctx context.Context, out string) error {
	root, err := ModuleRoot(ctx)
	if err != nil {
		return err
	}
	return run(ctx, root, "sh", filepath.Join(root, "wasm-build.sh"), out)
}

// run runs a command in dir with the host's GOOS and GOARCH; its output is
// part of the error when it fails.
func run(ctx context.Context, dir, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = hostEnv()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out.String())
	}
	return nil
}

// hostEnv is the environment for go commands that build for this machine:
// GOOS and GOARCH set by the caller (for a wasip1 test run, say) are
// replaced by the host's. wasm-build.sh sets its own.
func hostEnv() []string {
	env := make([]string, 0, len(os.Environ())+2)
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "GOOS=") || strings.HasPrefix(kv, "GOARCH=") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "GOOS="+runtime.GOOS, "GOARCH="+runtime.GOARCH)
}

// exeSuffix is ".exe" on Windows.
func exeSuffix() string {
	if runtime.GOOS == "windows" {
		return ".exe"
	}
	return ""
}

// RunWithControlPlane is the body of a TestMain whose tests start
// sluice-controlplane processes: it builds the binary into a temporary
// directory and sets *bin to it, and the filter on each of FilterHosts into
// *filters when filters is not nil, then returns run()'s status (a
// testing.M's Run) and removes the directory. In short mode (short) it
// builds nothing and runs the tests, which skip themselves. pkg names the
// package in messages.
func RunWithControlPlane(pkg string, short bool, bin *string, filters *[]Filter, run func() int) int {
	if short {
		fmt.Println(pkg + ": skipped in -short mode (its tests start control planes and Envoy)")
		return run()
	}
	dir, err := os.MkdirTemp("", "sluice-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, pkg+":", err)
		return 1
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	*bin = filepath.Join(dir, "sluice-controlplane"+exeSuffix())
	if err := GoBuild(ctx, "./controlplane/cmd/sluice-controlplane", *bin); err != nil {
		fmt.Fprintln(os.Stderr, pkg+": build:", err)
		return 1
	}
	if filters != nil {
		fs, err := BuildFilters(ctx, dir)
		if err != nil {
			fmt.Fprintln(os.Stderr, pkg+": build:", err)
			return 1
		}
		*filters = fs
	}
	return run()
}
