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

// variant is one of the bootstraps users copy, with how the tests point
// Envoy at the filter built from this repository.
type variant struct {
	file   string // the file's name
	config []byte // its text
	// local and env make Envoy load the filter built in dir (by build).
	local func(dir string) Local
	env   func(dir string) []string
	build func(ctx context.Context, dir string) error
}

// variants are envoy.yaml (filter.wasm, its path changed) and
// envoy-native.yaml (libsluice.so, found in the search path).
var variants = []variant{
	{file: "envoy.yaml", config: Config,
		local: func(dir string) Local { return Local{Wasm: filepath.Join(dir, "filter.wasm")} },
		env:   func(string) []string { return nil },
		build: func(ctx context.Context, dir string) error {
			return stack.BuildWasm(ctx, filepath.Join(dir, "filter.wasm"))
		}},
	{file: "envoy-native.yaml", config: NativeConfig,
		local: func(string) Local { return Local{} },
		env:   func(dir string) []string { return []string{stack.ModuleSearchPath(dir)} },
		build: func(ctx context.Context, dir string) error {
			return stack.BuildNative(ctx, filepath.Join(dir, "libsluice.so"))
		}},
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

// TestValidate runs `envoy --mode validate` on each bootstrap with only
// the filter's path changed. Envoy's validate mode loads the filter and has
// it check the plugin configuration (filter.wasm's proxy_on_configure, the
// module's configuration hook), so this checks the bootstrap against
// Envoy's API and the plugin JSON against the filter's parser. A copy with
// a bad plugin field must be refused, naming it.
func TestValidate(t *testing.T) {
	if testing.Short() {
		t.Skip("runs Envoy")
	}
	for _, v := range variants {
		t.Run(v.file, func(t *testing.T) { validate(t, v) })
	}
}

// validate is TestValidate of one variant.
func validate(t *testing.T, v variant) {
	ctx := context.Background()
	dir := t.TempDir()
	if err := v.build(ctx, dir); err != nil {
		t.Fatal(err)
	}
	b, err := v.local(dir).Bootstrap(v.config)
	if err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(dir, "envoy.json")
	writeJSON(t, good, b)
	out, err := stack.ValidateEnvoy(ctx, "", good, v.env(dir)...)
	if err != nil {
		t.Fatalf("Envoy refuses %s: %v\n%s", v.file, err, out)
	}

	for _, tt := range []struct {
		name, old, new, want string
	}{
		{"plugin field", `"failure_mode": "open"`, `"failure_mode": "ajar"`, "failure_mode"},
		{"unknown plugin field", `"domain": "sluice-demo",`, `"domain": "sluice-demo", "domian": "x",`, "domian"},
		{"Envoy field", "connect_timeout: 0.25s", "connect_timeout: 0.25s\n    connect_timout: 1s", "connect_timout"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			text := strings.Replace(string(v.config), tt.old, tt.new, 1)
			if text == string(v.config) {
				t.Fatalf("%s has no %q", v.file, tt.old)
			}
			b, err := v.local(dir).Bootstrap([]byte(text))
			if err != nil {
				t.Fatal(err)
			}
			bad := filepath.Join(dir, "bad.json")
			writeJSON(t, bad, b)
			out, err := stack.ValidateEnvoy(ctx, "", bad, v.env(dir)...)
			if err == nil {
				t.Fatalf("Envoy accepts a bootstrap with %s", tt.new)
			}
			if !strings.Contains(out, tt.want) {
				t.Errorf("Envoy's output does not name %s (%v):\n%s", tt.want, err, stack.LogExcerpt(out))
			}
		})
	}
}

// loadProofTimeout replaces the files' 20 ms plugin timeout in tests that
// count answers: on a busy machine a call can take longer than 20 ms, and
// the filter then fails open, which is the file's promise but not what the
// counts test. (The timeout itself is the filter's tests' business.)
const loadProofTimeout = `"timeout": "10s"`

// TestServes runs each bootstrap (the filter's path and the addresses
// changed, and the plugin's timeout raised: loadProofTimeout) in front of
// an upstream, with a real control plane on its example policies: the
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
	for _, v := range variants {
		t.Run(v.file, func(t *testing.T) { serves(t, v, progs, dir) })
	}
}

// serves is TestServes of one variant, with the programs built in dir.
func serves(t *testing.T, v variant, progs stack.Programs, dir string) {
	ctx := context.Background()
	cp, err := stack.StartControlPlane(ctx, stack.ControlPlaneConfig{Binary: progs.ControlPlane, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Stop()
	up, err := stack.StartUpstream("127.0.0.1:0", "")
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close(ctx)
	config := strings.Replace(string(v.config), `"timeout": "20ms"`, loadProofTimeout, 1)
	if config == string(v.config) {
		t.Fatalf(`%s has no "timeout": "20ms" to raise`, v.file)
	}
	l := v.local(dir)
	l.Listen, l.ControlPlane, l.Backend = "127.0.0.1:0", cp.GRPCAddr(), up.Addr()
	b, err := l.Bootstrap([]byte(config))
	if err != nil {
		t.Fatal(err)
	}
	e, err := stack.StartEnvoy(ctx, stack.EnvoyConfig{Dir: t.TempDir(), Bootstrap: b, Concurrency: 1, Env: v.env(dir)})
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
	t.Logf("Envoy (1 worker, %s): RSS %.1f MB", v.file, float64(e.RSS())/(1<<20))
}
