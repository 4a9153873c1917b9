package abi

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/e2e/stack"
)

// devFilter builds filter.wasm with the sluicetest tag once: a request
// header valued "sluice-test-trap" makes it exit, which traps the VM.
var (
	devOnce sync.Once
	devWasm string
	devErr  error
)

func devFilter(t *testing.T) string {
	t.Helper()
	programs(t) // makes buildDir
	devOnce.Do(func() {
		ctx := context.Background()
		root, err := stack.ModuleRoot(ctx)
		if err != nil {
			devErr = err
			return
		}
		devWasm = filepath.Join(buildDir, "filter-dev.wasm")
		cmd := exec.CommandContext(ctx, "go", "build", "-buildmode=c-shared", "-trimpath", "-ldflags=-s -w",
			"-tags", "sluicetest", "-o", devWasm, "./filter/proxywasm")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
		if out, err := cmd.CombinedOutput(); err != nil {
			devErr = fmt.Errorf("build filter.wasm with sluicetest: %v\n%s", err, out)
		}
	})
	if devErr != nil {
		t.Fatal(devErr)
	}
	return devWasm
}

// reloadPolicy: 2 per hour per tenant.
const reloadPolicy = `
domain: abi
descriptors:
  - key: tenant
    rate_limit: {algorithm: sliding_log, unit: hour, requests_per_unit: 2}
`

// TestSharedBlocksSurviveReload: the VM that heard the control plane deny a
// tenant traps, and FAIL_RELOAD replaces it; the shared data is the
// process's, so the fresh VM, whose own precheck table is empty, rejects
// the tenant on the block its predecessor shared, without asking the
// control plane again, and the limit stays exact.
func TestSharedBlocksSurviveReload(t *testing.T) {
	progs, _ := programs(t)
	wasm := devFilter(t)
	ctx := context.Background()
	dir := t.TempDir()
	cp, up := backends(t, ctx, progs, dir, reloadPolicy)
	plugin := stack.PluginConfig{Cluster: stack.DefaultCluster, Domain: "abi", Timeout: "2s", FailureMode: "open",
		RateLimits: []stack.RateLimit{{Actions: []stack.Action{stack.RequestHeader("x-tenant", "tenant")}}},
		Precheck:   &stack.Precheck{Enabled: true}}
	filter := stack.WasmFilter(wasm, plugin.JSON())
	filter["typed_config"].(stack.M)["config"].(stack.M)["failure_policy"] = "FAIL_RELOAD"
	e, err := stack.StartEnvoy(ctx, stack.EnvoyConfig{Dir: dir, Concurrency: 1, Bootstrap: stack.Bootstrap(
		[]stack.M{stack.HTTPListener("in", 0, []stack.M{stack.VirtualHost("all", stack.RouteTo("/", "up"))}, filter)},
		[]stack.M{stack.Cluster("up", up.Addr()), stack.GRPCCluster(stack.DefaultCluster, cp.GRPCAddr())})})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Stop()
	client := &http.Client{Timeout: 10 * time.Second}
	url := e.URL("in") + "/"

	var codes []int
	for range 4 {
		codes = append(codes, get(t, client, url, "x-tenant", "r").code)
	}
	s := counters(t, e)
	if fmt.Sprint(codes) != "[200 200 429 429]" || s["wasmcustom.sluice.over_limit"] != 1 || s["wasmcustom.sluice.precheck_rejected"] != 1 {
		t.Fatalf("before the trap: %v; over_limit %d, precheck_rejected %d", codes,
			s["wasmcustom.sluice.over_limit"], s["wasmcustom.sluice.precheck_rejected"])
	}
	if a := get(t, client, url, "x-tenant", "sluice-test-trap"); a.code != 503 {
		log := e.Log()
		t.Fatalf("the trapping request got %d, want 503; Envoy's log ends: %s", a.code, log[max(0, len(log)-3000):])
	}
	var after []int
	start := time.Now()
	reloaded := waitFor(60*time.Second, func() bool {
		a := get(t, client, url, "x-tenant", "r")
		after = append(after, a.code)
		return a.code != 503
	})
	s = counters(t, e)
	t.Logf("served again after %v (%v); vm_reload_success %d; over_limit %d, precheck_rejected %d, precheck_shared %d, allowed %d",
		time.Since(start).Round(time.Millisecond), compact(after), s["wasm.sluice.vm_reload_success"],
		s["wasmcustom.sluice.over_limit"], s["wasmcustom.sluice.precheck_rejected"], s["wasmcustom.sluice.precheck_shared"],
		s["wasmcustom.sluice.allowed"])
	if !reloaded || s["wasm.sluice.vm_reload_success"] < 1 {
		t.Fatalf("no reload within 60 s: %v", compact(after))
	}
	if last := after[len(after)-1]; last != 429 {
		t.Errorf("the fresh VM answered %d for the tenant over its limit", last)
	}
	if s["wasmcustom.sluice.over_limit"] != 1 || s["wasmcustom.sluice.precheck_shared"] != 1 || s["wasmcustom.sluice.allowed"] != 2 {
		t.Errorf("the fresh VM asked the control plane again (over_limit %d, allowed %d) or did not reject on the shared block (precheck_shared %d)",
			s["wasmcustom.sluice.over_limit"], s["wasmcustom.sluice.allowed"], s["wasmcustom.sluice.precheck_shared"])
	}
}
