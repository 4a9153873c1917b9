package stack

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"
)

// TestWorkerConns opens two connections per worker of a real Envoy and
// checks, from Envoy's per-worker counters, that each worker holds exactly
// the connections WorkerConns says it does, and that they serve requests.
func TestWorkerConns(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Envoy")
	}
	ctx := context.Background()
	up, err := StartUpstream("127.0.0.1:0", "")
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close(ctx)
	l := HTTPListener("in", 0, []M{VirtualHost("all", RouteTo("/", "up"))})
	l["stat_prefix"] = "in"
	e, err := StartEnvoy(ctx, EnvoyConfig{Dir: t.TempDir(), Concurrency: 3, LogLevel: "warn",
		Bootstrap: Bootstrap([]M{l}, []M{Cluster("up", up.Addr())})})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Stop()
	conns, err := e.WorkerConns("in", 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(conns) != 6 {
		t.Fatalf("%d connections, want 6", len(conns))
	}
	for i, c := range conns {
		if c.Worker != i/2 {
			t.Errorf("connection %d is on worker %d, want %d (ordered by worker)", i, c.Worker, i/2)
		}
		req, _ := http.NewRequest("GET", "http://"+c.Addr()+"/x", nil)
		resp, body, err := c.Do(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("connection %d: %v %v %q", i, err, resp, body)
		}
	}
	for w := range 3 {
		if n := e.Stat("listener.in.worker_" + strconv.Itoa(w) + ".downstream_cx_active"); n != 2 {
			t.Errorf("worker %d has %d connections, want 2", w, n)
		}
	}
	if up.Total() != 6 {
		t.Errorf("the upstream saw %d requests, want 6", up.Total())
	}
	conns[0].Close()
	req, _ := http.NewRequest("GET", "http://"+conns[0].Addr()+"/x", nil)
	if _, _, err := conns[0].Do(req); err == nil {
		t.Error("a closed WorkerConn sent a request")
	}
}

// TestConfigFiles starts Envoy on listeners and clusters from ConfigFiles
// and checks that a new version adds a listener routing to a new cluster,
// and that a bad one is rejected.
func TestConfigFiles(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Envoy")
	}
	ctx := context.Background()
	dir := t.TempDir()
	lf, err := NewListenerFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := NewClusterFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	a := HTTPListener("a", 0, []M{VirtualHost("all", DirectResponse("/", 200, "a"))})
	if err := lf.Write(a); err != nil {
		t.Fatal(err)
	}
	if err := cf.Write(); err != nil {
		t.Fatal(err)
	}
	boot := Bootstrap(nil, nil)
	boot["dynamic_resources"] = M{"lds_config": lf.ConfigSource(), "cds_config": cf.ConfigSource()}
	e, err := StartEnvoy(ctx, EnvoyConfig{Dir: dir, LogLevel: "warn", Bootstrap: boot})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Stop()
	if e.ListenerAddr("a") == "" {
		t.Fatal("listener a from the file is not bound")
	}
	wait := func(stat string, want int64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for e.Stat(stat) != want {
			if time.Now().After(deadline) {
				t.Fatalf("%s = %d, want %d", stat, e.Stat(stat), want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	up, err := StartUpstream("127.0.0.1:0", "")
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close(ctx)
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	if err := cf.Write(Cluster("up", up.Addr())); err != nil {
		t.Fatal(err)
	}
	wait("cluster_manager.cds.update_success", 2)
	b := HTTPListener("b", 0, []M{VirtualHost("all", RouteTo("/", "up"))})
	b["address"] = SocketAddress("127.0.0.1", port)
	if err := lf.Write(a, b); err != nil {
		t.Fatal(err)
	}
	wait("listener_manager.lds.update_success", 2)
	wait("listener_manager.total_listeners_active", 2)
	resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/b")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || up.Total() != 1 {
		t.Fatalf("through the new listener and cluster: status %d, the upstream saw %d", resp.StatusCode, up.Total())
	}
	bad := HTTPListener("c", 0, []M{VirtualHost("all", DirectResponse("/", 200, "c"))})
	bad["address"] = M{"socket_address": M{"address": "not an address", "port_value": 0}}
	if err := lf.Write(a, b, bad); err != nil {
		t.Fatal(err)
	}
	wait("listener_manager.lds.update_rejected", 1)
	wait("listener_manager.total_listeners_active", 2)
}
