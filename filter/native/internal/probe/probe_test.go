package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/e2e/stack"
)

// The probe in real Envoy: one Envoy (2 workers) for the tests of this
// file, started by TestMain with the probe module and an echo upstream that
// is also the callouts' cluster.
var (
	envoy    *stack.Envoy
	upstream *echo
	module   string // the built libprobe.so
)

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		fmt.Println("probe: skipped in -short mode (its tests run real Envoy)")
		os.Exit(m.Run())
	}
	os.Exit(runWithEnvoy(m))
}

// runWithEnvoy builds the module, starts the upstream and Envoy, runs the
// tests and stops both.
func runWithEnvoy(m *testing.M) int {
	dir, err := os.MkdirTemp("", "sluice-probe-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "probe:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if module, err = stack.BuildNativeModule(ctx, "./filter/native/internal/probe", dir, "probe"); err != nil {
		fmt.Fprintln(os.Stderr, "probe: build:", err)
		return 1
	}
	if upstream, err = startEcho(); err != nil {
		fmt.Fprintln(os.Stderr, "probe:", err)
		return 1
	}
	defer upstream.Close()
	envoy, err = startProbeEnvoy(ctx, dir, "envoy", 2, upstream.addr())
	if err != nil {
		fmt.Fprintln(os.Stderr, "probe:", err)
		return 1
	}
	code := m.Run()
	if err := envoy.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "probe:", err)
	}
	return code
}

// startProbeEnvoy starts Envoy with workers workers, the probe filter on
// listener "in" and the echo upstream as cluster "echo". The module is
// found in dir, Envoy's working directory.
func startProbeEnvoy(ctx context.Context, dir, name string, workers int, echoAddr string) (*stack.Envoy, error) {
	conf := []byte(`{"cluster":"echo"}`)
	boot := stack.Bootstrap(
		[]stack.M{stack.HTTPListener("in", 0, []stack.M{stack.VirtualHost("all", stack.RouteTo("/", "echo"))},
			stack.NativeFilter("probe", "probe", conf, ""))},
		[]stack.M{stack.Cluster("echo", echoAddr), stack.GRPCCluster("echo-h2", echoAddr), emptyCluster("empty")},
	)
	return stack.StartEnvoy(ctx, stack.EnvoyConfig{Dir: dir, Name: name, Bootstrap: boot, Concurrency: workers})
}

// emptyCluster returns a cluster with no endpoint at all.
func emptyCluster(name string) stack.M {
	return stack.M{"name": name, "type": "STATIC", "connect_timeout": "1s",
		"load_assignment": stack.M{"cluster_name": name, "endpoints": []stack.M{}}}
}

// echo is the upstream: it answers /callout with 200 "callout answer",
// /trailers with a body and a grpc-status trailer, /slow after the client
// gave up, and every other request with the request headers it received,
// as JSON.
type echo struct {
	ln  net.Listener
	srv *http.Server
}

func startEcho() (*echo, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	e := &echo{ln: ln, srv: &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(serveEcho)}}
	// HTTP/1.1 and, for cluster echo-h2, HTTP/2 without TLS (as gRPC).
	e.srv.Protocols = new(http.Protocols)
	e.srv.Protocols.SetHTTP1(true)
	e.srv.Protocols.SetUnencryptedHTTP2(true)
	go e.srv.Serve(ln)
	return e, nil
}

func serveEcho(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/slow" {
		// Longer than the callout's timeout: Envoy gives up first.
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
		return
	}
	if r.URL.Path == "/trailers" {
		// A gRPC-style answer: its status in a trailer.
		w.Header().Set("Trailer", "grpc-status")
		io.WriteString(w, "body before the trailer")
		w.Header().Set("grpc-status", "7")
		return
	}
	if r.URL.Path == "/callout" {
		w.Header().Set("x-callout", "yes")
		io.WriteString(w, "callout answer")
		return
	}
	w.Header().Set("content-type", "application/json")
	json.NewEncoder(w).Encode(r.Header)
}

func (e *echo) addr() string { return e.ln.Addr().String() }

// Close stops the upstream.
func (e *echo) Close() { e.srv.Close() }

// probeResult is what a request through the probe returned.
type probeResult struct {
	status  int
	header  http.Header // the response's
	echoed  http.Header // the request headers the upstream received
	body    string
	elapsed time.Duration
}

// get sends a request with mode x-probe through Envoy, with extra headers.
func get(t *testing.T, mode string, extra map[string]string) probeResult {
	t.Helper()
	return send(t, http.MethodGet, mode, extra, nil)
}

// send sends a request through Envoy.
func send(t *testing.T, method, mode string, extra map[string]string, body io.Reader) probeResult {
	t.Helper()
	r, err := do(method, mode, extra, body)
	if err != nil {
		t.Fatalf("%v\n%s", err, envoy.LogExcerpt())
	}
	return r
}

// do sends a request through Envoy (any goroutine may call it).
func do(method, mode string, extra map[string]string, body io.Reader) (probeResult, error) {
	req, err := http.NewRequest(method, envoy.URL("in")+"/probe/"+mode+"?q=1", body)
	if err != nil {
		return probeResult{}, err
	}
	req.Header.Set("x-probe", mode)
	for k, v := range extra {
		req.Header.Set(k, v)
	}
	client := &http.Client{Timeout: 30 * time.Second}
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return probeResult{}, fmt.Errorf("%s %s: %w", method, mode, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	r := probeResult{status: resp.StatusCode, header: resp.Header, body: string(b), elapsed: time.Since(start)}
	if strings.HasPrefix(resp.Header.Get("content-type"), "application/json") && resp.Header.Get("x-probe-worker") != "" {
		json.Unmarshal(b, &r.echoed)
	}
	return r, nil
}

// wantOK fails the test unless r is a 200.
func wantOK(t *testing.T, r probeResult) {
	t.Helper()
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
}

// wantNotes checks the response headers of r, by name.
func wantNotes(t *testing.T, r probeResult, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got := r.header.Get(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
}

// tid reads a thread id note.
func tid(t *testing.T, r probeResult, name string) int {
	t.Helper()
	n, err := strconv.Atoi(r.header.Get("x-probe-" + name))
	if err != nil {
		t.Fatalf("x-probe-%s = %q: %v (headers %v)", name, r.header.Get("x-probe-"+name), err, r.header)
	}
	return n
}

// threadName returns the name of Envoy's thread tid (/proc/<pid>/task/<tid>/comm).
func threadName(t *testing.T, tid int) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(envoy.PID()), "task", strconv.Itoa(tid), "comm"))
	if err != nil {
		t.Fatalf("thread %d of Envoy: %v", tid, err)
	}
	return strings.TrimSpace(string(b))
}

// isWorker reports whether tid is one of Envoy's worker threads.
func isWorker(t *testing.T, tid int) bool {
	return strings.HasPrefix(threadName(t, tid), "wrk:worker_")
}

// parallel runs n requests of mode from c concurrent clients.
func parallel(t *testing.T, n, c int, mode string) []probeResult {
	t.Helper()
	out := make([]probeResult, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	next := make(chan int, n)
	for i := range n {
		next <- i
	}
	close(next)
	for range c {
		wg.Go(func() {
			for i := range next {
				out[i], errs[i] = do(http.MethodGet, mode, nil, nil)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("%v\n%s", err, envoy.LogExcerpt())
		}
	}
	return out
}
