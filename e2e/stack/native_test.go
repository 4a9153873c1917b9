package stack

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
)

// TestNativeFilterFile: libsluice.so built by BuildNative, loaded from its
// file by NativeFilterFile with filter.wasm's stat names, runs in real
// Envoy on a plugin configuration: with its control plane unreachable, it
// fails open, and counts it under filter.wasm's name.
func TestNativeFilterFile(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the native module and starts Envoy")
	}
	ctx := context.Background()
	dir := t.TempDir()
	so := filepath.Join(dir, "libsluice.so")
	if err := BuildNative(ctx, so); err != nil {
		t.Fatal(err)
	}
	up, err := StartUpstream("127.0.0.1:0", "")
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close(ctx)
	plugin := []byte(`{"cluster":"cp","domain":"d","failure_mode":"open","rate_limits":[{"actions":[{"remote_address":{}}]}]}`)
	e, err := StartEnvoy(ctx, EnvoyConfig{Dir: dir, Bootstrap: Bootstrap(
		[]M{HTTPListener("in", 0, []M{VirtualHost("all", RouteTo("/", "up"))}, NativeFilterFile(so, "sluice", plugin, "wasmcustom"))},
		[]M{Cluster("up", up.Addr()), GRPCCluster("cp", "127.0.0.1:1")})})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Stop()
	resp, err := http.Get(e.URL("in") + "/x")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || up.Total() != 1 {
		t.Fatalf("through the module: %d, upstream saw %d", resp.StatusCode, up.Total())
	}
	if !strings.Contains(e.Log(), `configuration of domain "d" accepted`) {
		t.Errorf("the module did not accept the configuration:\n%s", e.LogExcerpt())
	}
	if n := e.Stat("wasmcustom.sluice.failure_open"); n != 1 {
		t.Errorf("wasmcustom.sluice.failure_open = %d, want 1", n)
	}
}
