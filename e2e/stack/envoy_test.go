package stack

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestEnvoyServes starts real Envoy in front of an Upstream and checks the
// harness: the listener's kernel-picked port, a request through it, and
// Envoy's own counter of it.
func TestEnvoyServes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Envoy")
	}
	ctx := context.Background()
	up, err := StartUpstream("127.0.0.1:0", "")
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close(ctx)
	e, err := StartEnvoy(ctx, EnvoyConfig{Dir: t.TempDir(), Bootstrap: Bootstrap(
		[]M{HTTPListener("in", 0, []M{VirtualHost("all", RouteTo("/", "up"))})},
		[]M{Cluster("up", up.Addr())})})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Stop()
	resp, err := http.Get(e.URL("in") + "/x")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), "GET /x") || up.Total() != 1 {
		t.Fatalf("through Envoy: %d %q, upstream saw %d", resp.StatusCode, b, up.Total())
	}
	if n := e.Stat("http.in.downstream_rq_2xx"); n != 1 {
		t.Errorf("http.in.downstream_rq_2xx = %d, want 1", n)
	}
	if rss := e.RSS(); rss <= 0 {
		t.Errorf("RSS = %d", rss)
	}
	if err := e.Stop(); err != nil {
		t.Error(err)
	}
	if e.PID() != 0 {
		t.Error("Envoy still runs after Stop")
	}
}

func TestParseStats(t *testing.T) {
	m, err := parseStats(strings.NewReader("a.b: 3\nc: No recorded values\nh: P0(nan,1) P25(nan,2)\nwasmcustom.sluice.allowed: 10\n"))
	if err != nil || len(m) != 2 || m["a.b"] != 3 || m["wasmcustom.sluice.allowed"] != 10 {
		t.Fatalf("parseStats = %v, %v", m, err)
	}
}
