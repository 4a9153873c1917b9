package envoy

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/e2e/stack"
)

// buildWasm builds filter.wasm into dir.
func buildWasm(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "filter.wasm")
	if err := stack.BuildWasm(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	return p
}

// writeJSON writes a bootstrap where Envoy can read it.
func writeJSON(t *testing.T, path string, b map[string]any) {
	t.Helper()
	js, err := json.MarshalIndent(b, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, js, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestValidate runs `envoy --mode validate` on envoy.yaml with only the path
// of filter.wasm changed. Envoy's validate mode loads the module and runs
// proxy_on_configure on the plugin configuration, so this checks the
// bootstrap against Envoy's API and the plugin JSON against the filter's
// parser. A copy with a bad plugin field must be refused, naming it.
func TestValidate(t *testing.T) {
	if testing.Short() {
		t.Skip("runs Envoy")
	}
	ctx := context.Background()
	dir := t.TempDir()
	b, err := Local{Wasm: buildWasm(t, dir)}.Bootstrap(Config)
	if err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(dir, "envoy.json")
	writeJSON(t, good, b)
	out, err := stack.ValidateEnvoy(ctx, "", good)
	if err != nil {
		t.Fatalf("Envoy refuses envoy.yaml: %v\n%s", err, out)
	}

	for _, tt := range []struct {
		name, old, new, want string
	}{
		{"plugin field", `"failure_mode": "open"`, `"failure_mode": "ajar"`, "failure_mode"},
		{"unknown plugin field", `"domain": "sluice-demo",`, `"domain": "sluice-demo", "domian": "x",`, "domian"},
		{"Envoy field", "connect_timeout: 0.25s", "connect_timeout: 0.25s\n    connect_timout: 1s", "connect_timout"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			text := strings.Replace(string(Config), tt.old, tt.new, 1)
			if text == string(Config) {
				t.Fatalf("envoy.yaml has no %q", tt.old)
			}
			b, err := Local{Wasm: filepath.Join(dir, "filter.wasm")}.Bootstrap([]byte(text))
			if err != nil {
				t.Fatal(err)
			}
			bad := filepath.Join(dir, "bad.json")
			writeJSON(t, bad, b)
			out, err := stack.ValidateEnvoy(ctx, "", bad)
			if err == nil {
				t.Fatalf("Envoy accepts a bootstrap with %s", tt.new)
			}
			if !strings.Contains(out, tt.want) {
				t.Errorf("Envoy's output does not name %s (%v):\n%s", tt.want, err, stack.LogExcerpt(out))
			}
		})
	}
}

// loadProofTimeout replaces envoy.yaml's 20 ms plugin timeout in tests that
// count answers: on a busy machine a call can take longer than 20 ms, and
// the filter then fails open, which is the file's promise but not what the
// counts test. (The timeout itself is the filter's tests' business.)
const loadProofTimeout = `"timeout": "10s"`

// TestServes runs envoy.yaml (filter.wasm's path and the addresses changed,
// and the plugin's timeout raised: loadProofTimeout) in front of an
// upstream, with a real control plane on its example policies: the
// per-address limit of 10 admits 10 requests, then Envoy answers 429 with
// the headers the file asks for.
func TestServes(t *testing.T) {
	if testing.Short() {
		t.Skip("runs Envoy")
	}
	ctx := context.Background()
	dir := t.TempDir()
	progs, err := stack.Build(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	cp, err := stack.StartControlPlane(ctx, stack.ControlPlaneConfig{Binary: progs.ControlPlane, Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Stop()
	up, err := stack.StartUpstream("127.0.0.1:0", "")
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close(ctx)
	config := strings.Replace(string(Config), `"timeout": "20ms"`, loadProofTimeout, 1)
	if config == string(Config) {
		t.Fatal(`envoy.yaml has no "timeout": "20ms" to raise`)
	}
	b, err := Local{Wasm: progs.Wasm, Listen: "127.0.0.1:0", ControlPlane: cp.GRPCAddr(), Backend: up.Addr()}.Bootstrap([]byte(config))
	if err != nil {
		t.Fatal(err)
	}
	e, err := stack.StartEnvoy(ctx, stack.EnvoyConfig{Dir: dir, Bootstrap: b, Concurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Stop()

	url := e.URL(ListenerName) + "/hello"
	var codes []int
	var last *http.Response
	for range 11 {
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
		last = resp
	}
	for i, c := range codes {
		want := 200
		if i == 10 {
			want = 429
		}
		if c != want {
			t.Fatalf("status codes %v: want 10 x 200, then 429 (log:\n%s)", codes, e.LogExcerpt())
		}
	}
	if got := last.Header.Get("RateLimit-Policy"); got != `"per_address";q=10;w=10` {
		t.Errorf("RateLimit-Policy = %q", got)
	}
	if last.Header.Get("RateLimit") == "" || last.Header.Get("Retry-After") == "" {
		t.Errorf("429 without RateLimit or Retry-After: %v", last.Header)
	}
	if n := up.Total(); n != 10 {
		t.Errorf("the upstream saw %d requests, want 10", n)
	}
	if n := e.Stat("wasmcustom.sluice.allowed"); n != 10 {
		t.Errorf("wasmcustom.sluice.allowed = %d, want 10", n)
	}
	t.Logf("Envoy (1 worker, filter.wasm loaded): RSS %.1f MB", float64(e.RSS())/(1<<20))
}
