package host

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/h2c"

	"github.com/sluicehq/sluice/internal/portlock"
)

// testRoot holds the guest module and the shared compilation cache.
var testRoot string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sluice-host-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	testRoot = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

var (
	guestOnce sync.Once
	guestBin  []byte
	guestErr  error
)

// guestWasm builds testdata/guest once per test binary. GOOS and GOARCH are
// set explicitly so a host GOOS in the environment cannot leak in.
func guestWasm(t testing.TB) []byte {
	t.Helper()
	guestOnce.Do(func() {
		out := filepath.Join(testRoot, "guest.wasm")
		cmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", out, "./testdata/guest")
		cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			guestErr = fmt.Errorf("building the test guest: %v\n%s", err, b)
			return
		}
		guestBin, guestErr = os.ReadFile(out)
	})
	if guestErr != nil {
		t.Fatal(guestErr)
	}
	return guestBin
}

// logBuffer collects log output safely across goroutines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// newHost starts a host with the test guest; cfg's zero fields get test
// defaults. The host is closed when the test ends.
func newHost(t testing.TB, cfg Config) (*Host, *logBuffer) {
	t.Helper()
	cfg.Wasm = guestWasm(t)
	cfg.CompilationCacheDir = filepath.Join(testRoot, "cache")
	logs := &logBuffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	h, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := h.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return h, logs
}

// recordingUpstream is an in-process upstream that remembers requests.
type recordingUpstream struct {
	mu   sync.Mutex
	reqs []*http.Request
	body [][]byte
}

func (u *recordingUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	u.mu.Lock()
	u.reqs = append(u.reqs, r)
	u.body = append(u.body, b)
	u.mu.Unlock()
	w.Header().Set("X-Upstream", "yes")
	w.Header().Set("X-Upstream-Secret", "hide me")
	fmt.Fprintf(w, "upstream saw %s %s", r.Method, r.URL.RequestURI())
}

func (u *recordingUpstream) last(t *testing.T) (*http.Request, []byte) {
	t.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.reqs) == 0 {
		t.Fatal("the upstream got no request")
	}
	return u.reqs[len(u.reqs)-1], u.body[len(u.body)-1]
}

func (u *recordingUpstream) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.reqs)
}

// serve runs one request through p without sockets.
func serve(p http.Handler, method, target string, body string, header map[string]string) *httptest.ResponseRecorder {
	var rb io.Reader
	if body != "" {
		rb = strings.NewReader(body)
	}
	r := httptest.NewRequest(method, target, rb)
	r.RemoteAddr = "192.0.2.7:4242"
	for k, v := range header {
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	p.ServeHTTP(w, r)
	return w
}

// metricValue reads a metric, failing when it does not exist.
func metricValue(t *testing.T, h *Host, name string) int64 {
	t.Helper()
	m, ok := h.Metric(name)
	if !ok {
		t.Fatalf("metric %q is not defined; have %+v", name, h.Metrics())
	}
	return m.Value
}

func TestConfigureRefusal(t *testing.T) {
	for _, tc := range []struct {
		name      string
		plugin    string
		vm        string
		wantParts []string
	}{
		{"bad field", "cluster=cp\nbad_field=1", "", []string{"proxy_on_configure returned false", `field "bad_field": not allowed`, "VM 0"}},
		{"unknown field", "colour=blue", "", []string{"proxy_on_configure returned false", `unknown field "colour"`}},
		{"bad number", "timeout_ms=soon", "", []string{`field "timeout_ms"`}},
		{"vm configuration", "", "refuse", []string{"proxy_on_vm_start returned false", "refused on request"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(context.Background(), Config{
				Wasm:                guestWasm(t),
				CompilationCacheDir: filepath.Join(testRoot, "cache"),
				PluginConfig:        []byte(tc.plugin),
				VMConfig:            []byte(tc.vm),
				Logger:              slog.New(slog.NewTextHandler(io.Discard, nil)),
			})
			if err == nil {
				t.Fatal("New accepted a configuration the filter refuses")
			}
			for _, p := range tc.wantParts {
				if !strings.Contains(err.Error(), p) {
					t.Errorf("error %q does not contain %q", err, p)
				}
			}
		})
	}
}

func TestConfigValidation(t *testing.T) {
	for _, tc := range []struct {
		cfg   Config
		field string
	}{
		{Config{}, "WasmPath"},
		{Config{Wasm: []byte{0}, Workers: -1}, "Workers"},
		{Config{Wasm: []byte{0}, LogLevel: "loud"}, "LogLevel"},
		{Config{Wasm: []byte{0}, Clusters: map[string]string{"cp": "no-port"}}, `Clusters["cp"]`},
		{Config{Wasm: []byte{0}, PauseTimeout: -time.Second}, "PauseTimeout"},
		{Config{WasmPath: filepath.Join(testRoot, "missing.wasm")}, "WasmPath"},
	} {
		_, err := New(context.Background(), tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("New(%+v) = %v, want an error naming %s", tc.cfg, err, tc.field)
		}
	}
}

func TestRequestHeadersReadAddRemoveAndLifecycle(t *testing.T) {
	h, _ := newHost(t, Config{})
	up := &recordingUpstream{}
	p := NewHandlerProxy(h, up)
	w := serve(p, "GET", "/add", "", map[string]string{
		"X-User": "alice", "X-Replace": "old", "X-Remove-Me": "1", "X-Upstream-Secret": "client",
	})
	if w.Code != 200 {
		t.Fatalf("status %d, body %q", w.Code, w.Body)
	}
	r, _ := up.last(t)
	checks := map[string]string{
		"X-Guest-User":      "user=alice",
		"X-Replace":         "replaced",
		"X-Source-Address":  "192.0.2.7:4242",
		"X-Has-Request-Id":  "yes",
		"X-Forwarded-Proto": "http",
		// :authority, :path, :method, :scheme + 4 request headers +
		// x-forwarded-proto + x-request-id.
		"X-Headers-Seen": "10",
	}
	for k, want := range checks {
		if got := r.Header.Get(k); got != want {
			t.Errorf("upstream header %s = %q, want %q", k, got, want)
		}
	}
	if v := r.Header.Values("X-Replace"); len(v) != 1 {
		t.Errorf("X-Replace values = %q, want one", v)
	}
	if _, ok := r.Header["X-Remove-Me"]; ok {
		t.Error("X-Remove-Me reached the upstream")
	}
	if got := r.URL.RequestURI(); got != "/rewritten?from=add" {
		t.Errorf("upstream path = %q, want the :path the filter set", got)
	}
	// Response side: the filter's change is applied, and request headers are
	// not readable in proxy_on_response_headers (Envoy: BAD_ARGUMENT).
	if got := w.Header().Get("X-Resp-Guest"); got != "/add" {
		t.Errorf("X-Resp-Guest = %q", got)
	}
	if got := w.Header().Get("X-Req-In-Resp"); got != strconv.Itoa(int(StatusBadArgument)) {
		t.Errorf("X-Req-In-Resp = %q, want %d", got, StatusBadArgument)
	}
	if _, ok := w.Header()["X-Upstream-Secret"]; ok {
		t.Error("the filter removed X-Upstream-Secret but it was sent")
	}
	if w.Header().Get("X-Upstream") != "yes" {
		t.Error("upstream headers were lost")
	}
	// proxy_on_log saw the final request and response headers, then
	// proxy_on_done and proxy_on_delete ran.
	if v, _, _ := h.SharedData("last-log"); string(v) != "/rewritten?from=add 200" {
		t.Errorf("last-log = %q", v)
	}
	if metricValue(t, h, "guest_logs") != 1 || metricValue(t, h, "guest_deletes") != 1 {
		t.Errorf("logs %d deletes %d, want 1 1", metricValue(t, h, "guest_logs"), metricValue(t, h, "guest_deletes"))
	}
}

func TestLocalResponseFromRequestHeaders(t *testing.T) {
	h, _ := newHost(t, Config{})
	up := &recordingUpstream{}
	w := serve(NewHandlerProxy(h, up), "GET", "/deny", "", nil)
	if w.Code != 403 || w.Body.String() != "denied by guest" {
		t.Fatalf("got %d %q, want 403 denied by guest", w.Code, w.Body)
	}
	if w.Header().Get("X-Denied") != "1" || w.Header().Get("Content-Type") != "text/plain" {
		t.Errorf("headers %v", w.Header())
	}
	// Envoy runs local replies through the encoder filters, this one included.
	if w.Header().Get("X-Resp-Guest") != "/deny" {
		t.Errorf("proxy_on_response_headers did not run on the local reply: %v", w.Header())
	}
	if up.count() != 0 {
		t.Error("a denied request reached the upstream")
	}
	if v, _, _ := h.SharedData("last-log"); string(v) != "/deny 403" {
		t.Errorf("last-log = %q", v)
	}
}

func TestLocalResponseFromResponseHeaders(t *testing.T) {
	h, _ := newHost(t, Config{})
	w := serve(NewHandlerProxy(h, &recordingUpstream{}), "GET", "/resp-local", "", nil)
	if w.Code != 418 || w.Body.String() != "teapot from response" {
		t.Fatalf("got %d %q", w.Code, w.Body)
	}
	if w.Header().Get("X-Upstream") != "" {
		t.Error("the upstream response's headers survived the local reply")
	}
}

// h2cServer starts an HTTP/2 cleartext server on 127.0.0.1.
func h2cServer(t *testing.T, handler http.HandlerFunc) string {
	t.Helper()
	srv := httptest.NewUnstartedServer(h2c.NewHandler(handler, &http2.Server{}))
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

func TestHTTPCallResumesOnResponse(t *testing.T) {
	var seen sync.Map
	addr := h2cServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		seen.Store("proto", r.ProtoMajor)
		seen.Store("host", r.Host)
		seen.Store("path", r.URL.Path)
		seen.Store("ctx", r.Header.Get("X-From-Context"))
		w.Header().Set("Trailer", "X-Trailer")
		w.Write([]byte("pong:" + string(b)))
		w.Header().Set("X-Trailer", "t")
	})
	h, _ := newHost(t, Config{
		PluginConfig: []byte("cluster=cp\nauthority=cp.local\ntimeout_ms=5000"),
		Clusters:     map[string]string{"cp": addr},
	})
	up := &recordingUpstream{}
	w := serve(NewHandlerProxy(h, up), "GET", "/call", "", nil)
	if w.Code != 200 {
		t.Fatalf("status %d body %q", w.Code, w.Body)
	}
	r, _ := up.last(t)
	if r.Header.Get("X-Call-Status") != "200" || r.Header.Get("X-Call-Body") != "pong:ping" || r.Header.Get("X-Call-Trailers") != "1" {
		t.Errorf("upstream headers %v", r.Header)
	}
	if p, _ := seen.Load("proto"); p != 2 {
		t.Errorf("the call used HTTP/%v, want HTTP/2", p)
	}
	if v, _ := seen.Load("host"); v != "cp.local" {
		t.Errorf("call :authority = %v", v)
	}
	if v, _ := seen.Load("path"); v != "/echo" {
		t.Errorf("call :path = %v", v)
	}
	if v, _ := seen.Load("ctx"); v == "" {
		t.Error("call headers were lost")
	}
}

func TestHTTPCallFailures(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	slow := h2cServer(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	// A port nothing listens on: reserved, never bound (a closed :0 port
	// could be taken by another test process meanwhile).
	port, err := portlock.Reserve()
	if err != nil {
		t.Fatal(err)
	}
	closed := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))

	for _, tc := range []struct {
		name string
		mode CallFailureMode
		addr string
		path string
		want []string
	}{
		{"envoy timeout http", CallFailureEnvoy, slow, "/call", []string{"status=504", "body=upstream request timeout"}},
		{"envoy timeout grpc", CallFailureEnvoy, slow, "/call-grpc", []string{"status=200 grpc-status=14 grpc-message=upstream request timeout"}},
		{"envoy connection refused", CallFailureEnvoy, closed, "/call", []string{"status=503", "upstream connect error or disconnect/reset before headers"}},
		{"empty timeout", CallFailureEmpty, slow, "/call", []string{"headers=0 status=11 message=reset"}},
		{"empty connection refused", CallFailureEmpty, closed, "/call-grpc", []string{"headers=0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, _ := newHost(t, Config{
				PluginConfig: []byte("cluster=cp\nauthority=cp.local\ntimeout_ms=50"),
				Clusters:     map[string]string{"cp": tc.addr},
				CallFailures: tc.mode,
			})
			up := &recordingUpstream{}
			start := time.Now()
			w := serve(NewHandlerProxy(h, up), "GET", tc.path, "", nil)
			if w.Code != 503 {
				t.Fatalf("status %d body %q, want the guest's 503", w.Code, w.Body)
			}
			for _, p := range tc.want {
				if !strings.Contains(w.Body.String(), p) {
					t.Errorf("body %q does not contain %q", w.Body, p)
				}
			}
			if up.count() != 0 {
				t.Error("the request reached the upstream")
			}
			if el := time.Since(start); el > 3*time.Second {
				t.Errorf("took %v for a 50 ms call timeout", el)
			}
		})
	}
}

func TestHTTPCallUnknownCluster(t *testing.T) {
	h, _ := newHost(t, Config{})
	up := &recordingUpstream{}
	serve(NewHandlerProxy(h, up), "GET", "/call-unknown", "", nil)
	r, _ := up.last(t)
	if got := r.Header.Get("X-Call-Status"); got != strconv.Itoa(int(StatusBadArgument)) {
		t.Errorf("proxy_http_call to an unknown cluster = %s, want BAD_ARGUMENT", got)
	}
}

func TestPausedStreamTimesOut(t *testing.T) {
	h, _ := newHost(t, Config{PauseTimeout: 50 * time.Millisecond})
	up := &recordingUpstream{}
	w := serve(NewHandlerProxy(h, up), "GET", "/hang", "", nil)
	if w.Code != http.StatusRequestTimeout || w.Body.String() != "stream timeout" {
		t.Fatalf("got %d %q, want 408 stream timeout", w.Code, w.Body)
	}
	if w.Header().Get("X-Resp-Guest") != "/hang" {
		t.Error("the timeout reply did not go through proxy_on_response_headers")
	}
	if up.count() != 0 {
		t.Error("a paused request reached the upstream")
	}
}

// runHeaders drives one request through vm with the stream API.
func runHeaders(t *testing.T, vm *VM, path string) Headers {
	t.Helper()
	st, err := vm.NewStream(StreamInfo{RemoteAddr: "10.0.0.1:1000"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Finish()
	d := st.RequestHeaders(Headers{{":authority", "x"}, {":path", path}, {":method", "GET"}, {":scheme", "http"}}, true)
	if d.Kind != DecisionContinue {
		t.Fatalf("%s on VM %d: %v (%v)", path, vm.Index(), d.Kind, d.Err)
	}
	return st.Request()
}

func TestSharedDataCASAcrossVMs(t *testing.T) {
	h, _ := newHost(t, Config{Workers: 2})
	vm0, vm1 := h.VM(0), h.VM(1)
	want := func(hs Headers, k string, st Status) {
		t.Helper()
		if v, _ := hs.Get(k); v != strconv.Itoa(int(st)) {
			t.Fatalf("%s = %q, want %v", k, v, st)
		}
	}
	want(runHeaders(t, vm0, "/set"), "x-set", StatusOK)
	want(runHeaders(t, vm1, "/cas-get"), "x-cas-get", StatusOK)
	want(runHeaders(t, vm0, "/set"), "x-set", StatusOK)                  // VM 0 changes the value
	want(runHeaders(t, vm1, "/cas-set"), "x-cas-set", StatusCasMismatch) // VM 1's CAS is stale
	if v, _, _ := h.SharedData("cas-key"); string(v) != "fresh" {
		t.Fatalf("a stale CAS overwrote the value: %q", v)
	}
	want(runHeaders(t, vm1, "/cas-get"), "x-cas-get", StatusOK)
	want(runHeaders(t, vm1, "/cas-set"), "x-cas-set", StatusOK)
	if v, _, _ := h.SharedData("cas-key"); string(v) != "stale-writer" {
		t.Fatalf("value = %q", v)
	}
}

// TestSharedCounterUnderConcurrency: two VMs increment one shared counter
// with get and CAS-guarded set; no increment is lost. The first increment
// runs alone: as in Envoy, a set on a missing key succeeds whatever the cas,
// so two VMs that both found the key missing would both "create" it, and a
// stale creation could overwrite later increments. That race is the guest's
// (Envoy offers no add-if-absent), not the host's.
func TestSharedCounterUnderConcurrency(t *testing.T) {
	h, _ := newHost(t, Config{Workers: 2})
	up := &recordingUpstream{}
	p := NewHandlerProxy(h, up)
	const callers, each = 8, 25
	const n = 1 + callers*each
	serve(p, "GET", "/shared-inc", "", nil)
	var wg sync.WaitGroup
	for i := 0; i < callers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < each; j++ {
				serve(p, "GET", "/shared-inc", "", nil)
			}
		}()
	}
	wg.Wait()
	if v, _, _ := h.SharedData("counter"); string(v) != strconv.Itoa(n) {
		t.Fatalf("counter = %q after %d CAS increments on 2 VMs", v, n)
	}
	seen := map[string]bool{}
	for _, r := range up.reqs {
		c := r.Header.Get("X-Counter")
		if c == "" || seen[c] {
			t.Fatalf("increment value %q missing or seen twice (error %q)", c, r.Header.Get("X-Counter-Error"))
		}
		seen[c] = true
	}
}

func TestTicks(t *testing.T) {
	t.Run("manual", func(t *testing.T) {
		h, _ := newHost(t, Config{Workers: 2, ManualTicks: true, PluginConfig: []byte("tick_ms=1000")})
		for i := 0; i < 3; i++ {
			h.Tick()
		}
		if got := metricValue(t, h, "guest_ticks"); got != 6 {
			t.Fatalf("guest_ticks = %d after 3 ticks on 2 VMs, want 6", got)
		}
	})
	t.Run("no period no ticks", func(t *testing.T) {
		h, _ := newHost(t, Config{ManualTicks: true})
		h.Tick()
		if got := metricValue(t, h, "guest_ticks"); got != 0 {
			t.Fatalf("guest_ticks = %d without a tick period", got)
		}
	})
	t.Run("timer", func(t *testing.T) {
		h, _ := newHost(t, Config{Workers: 2, PluginConfig: []byte("tick_ms=5")})
		deadline := time.Now().Add(10 * time.Second)
		for metricValue(t, h, "guest_ticks") < 10 {
			if time.Now().After(deadline) {
				t.Fatalf("the tick timer fired %d times in 10 s at a 5 ms period", metricValue(t, h, "guest_ticks"))
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
}

func TestMetricsAreSharedAcrossVMs(t *testing.T) {
	h, _ := newHost(t, Config{Workers: 2})
	up := &recordingUpstream{}
	p := NewHandlerProxy(h, up)
	serve(p, "GET", "/metrics", "", nil)
	serve(p, "GET", "/metrics", "", nil)
	if got := metricValue(t, h, "guest_requests"); got != 2 {
		t.Errorf("guest_requests = %d, want 2 (one per VM, one metric)", got)
	}
	if got := metricValue(t, h, "guest_gauge"); got != 6 {
		t.Errorf("guest_gauge = %d, want 6", got)
	}
	if m, _ := h.Metric("guest_hist"); m.Type != MetricHistogram || m.Count != 2 || m.Sum != 14 || m.Min != 7 || m.Max != 7 {
		t.Errorf("guest_hist = %+v", m)
	}
	r, _ := up.last(t)
	for k, want := range map[string]Status{
		"X-Metric-Zero":     StatusBadArgument,
		"X-Metric-Hist-Get": StatusBadArgument,
		"X-Metric-Unknown":  StatusNotFound,
	} {
		if got := r.Header.Get(k); got != strconv.Itoa(int(want)) {
			t.Errorf("%s = %q, want %v", k, got, want)
		}
	}
	if got := r.Header.Get("X-Metric-Requests"); got != "1" && got != "2" {
		t.Errorf("proxy_get_metric = %q", got)
	}
	rec := httptest.NewRecorder()
	h.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, line := range []string{"guest_requests 2", "guest_gauge 6", "guest_hist_count 2", "guest_hist_sum 14"} {
		if !strings.Contains(rec.Body.String(), line+"\n") {
			t.Errorf("metrics output lacks %q:\n%s", line, rec.Body)
		}
	}
}

func TestProperties(t *testing.T) {
	now := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	h, _ := newHost(t, Config{Now: func() time.Time { return now }})
	up := &recordingUpstream{}
	serve(NewHandlerProxy(h, up), "POST", "/props", "", nil)
	r, _ := up.last(t)
	for k, want := range map[string]string{
		"X-Source-Port":        "4242",
		"X-Prop-Path":          "/props",
		"X-Prop-Method":        "POST",
		"X-Prop-Plugin":        "sluice",
		"X-Prop-Response-Code": strconv.Itoa(int(StatusNotFound)),
		"X-Prop-Missing":       strconv.Itoa(int(StatusNotFound)),
		"X-Time-Ok":            "yes",
		"X-Log-Level":          strconv.Itoa(int(LogInfo)),
		"X-Foreign":            strconv.Itoa(int(StatusNotFound)),
	} {
		if got := r.Header.Get(k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
}

func TestRequestBody(t *testing.T) {
	h, _ := newHost(t, Config{})
	up := &recordingUpstream{}
	p := NewHandlerProxy(h, up)
	w := serve(p, "POST", "/body", "hello", nil)
	if w.Code != 200 {
		t.Fatalf("status %d %q", w.Code, w.Body)
	}
	r, b := up.last(t)
	if string(b) != "HELLO" || r.ContentLength != 5 {
		t.Errorf("upstream body %q length %d, want HELLO 5", b, r.ContentLength)
	}
	w = serve(p, "POST", "/body", "forbidden words", nil)
	if w.Code != 403 || up.count() != 1 {
		t.Errorf("got %d, upstream requests %d; want 403 and no new upstream request", w.Code, up.count())
	}
	small, _ := newHost(t, Config{MaxBodyBytes: 3})
	if w := serve(NewHandlerProxy(small, up), "POST", "/body", "toolong", nil); w.Code != http.StatusRequestEntityTooLarge {
		t.Errorf("a body over MaxBodyBytes got %d, want 413", w.Code)
	}
}

func TestTrapFailsTheVM(t *testing.T) {
	h, logs := newHost(t, Config{Workers: 1})
	up := &recordingUpstream{}
	p := NewHandlerProxy(h, up)
	if w := serve(p, "GET", "/trap", "", nil); w.Code != 503 {
		t.Fatalf("a trapping filter gave %d, want 503", w.Code)
	}
	if h.VM(0).Failed() == nil {
		t.Fatal("the VM is not marked failed")
	}
	if w := serve(p, "GET", "/add", "", nil); w.Code != 503 {
		t.Fatalf("a request on a failed VM gave %d, want 503", w.Code)
	}
	if up.count() != 0 {
		t.Fatal("requests passed a failed filter")
	}
	if !strings.Contains(logs.String(), "assignment to entry in nil map") {
		t.Errorf("the guest's panic message was not logged:\n%s", logs)
	}

	open, _ := newHost(t, Config{Workers: 1, FailOpen: true})
	po := NewHandlerProxy(open, up)
	serve(po, "GET", "/trap", "", nil)
	if w := serve(po, "GET", "/add", "", nil); w.Code != 200 || up.count() == 0 {
		t.Fatalf("with FailOpen a failed VM gave %d and upstream count %d", w.Code, up.count())
	}
}

func TestProxyOverSockets(t *testing.T) {
	upstream := httptest.NewServer(&recordingUpstream{})
	t.Cleanup(upstream.Close)
	h, _ := newHost(t, Config{})
	p, err := NewProxy(h, upstream.URL)
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(p)
	t.Cleanup(front.Close)
	req, _ := http.NewRequest("GET", front.URL+"/add", nil)
	req.Header.Set("X-User", "bob")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(b) != "upstream saw GET /rewritten?from=add" {
		t.Fatalf("got %d %q", resp.StatusCode, b)
	}
	if resp.Header.Get("X-Resp-Guest") != "/add" || resp.Header.Get("X-Upstream-Secret") != "" {
		t.Errorf("response headers %v", resp.Header)
	}
	if _, err := NewProxy(h, "127.0.0.1:80"); err == nil {
		t.Error("NewProxy accepted an upstream without a scheme")
	}
}

func TestStreamAPI(t *testing.T) {
	h, _ := newHost(t, Config{Workers: 1})
	vm := h.VM(0)
	st, err := vm.NewStream(StreamInfo{RemoteAddr: "10.1.2.3:99"})
	if err != nil {
		t.Fatal(err)
	}
	d := st.RequestHeaders(Headers{{":path", "/deny"}, {":method", "GET"}, {":authority", "a"}}, true)
	if d.Kind != DecisionLocalResponse || d.Local.Status != 403 || string(d.Local.Body) != "denied by guest" || d.Local.Details != "denied_by_guest" {
		t.Fatalf("decision %+v", d)
	}
	if d := st.Await(context.Background()); d.Kind != DecisionLocalResponse {
		t.Fatalf("Await after a decision = %v", d.Kind)
	}
	st.Finish()
	st.Finish() // idempotent

	st, _ = vm.NewStream(StreamInfo{})
	d = st.RequestHeaders(Headers{{":path", "/hang"}}, true)
	if d.Kind != DecisionPause {
		t.Fatalf("decision %v, want pause", d.Kind)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if d := st.Await(ctx); d.Kind != DecisionTimeout {
		t.Fatalf("Await = %v, want timeout", d.Kind)
	}
	st.Finish()
}

func TestCloseStopsTheHost(t *testing.T) {
	h, _ := newHost(t, Config{})
	if err := h.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := h.VM(0).NewStream(StreamInfo{}); err == nil {
		t.Fatal("NewStream on a closed host succeeded")
	}
	if err := h.Close(context.Background()); err != nil {
		t.Fatal("second Close:", err)
	}
}

func TestSharedQueueNotifiesTheRegisteringVM(t *testing.T) {
	h, _ := newHost(t, Config{Workers: 2})
	up := &recordingUpstream{}
	serve(NewHandlerProxy(h, up), "GET", "/enqueue", "", nil)
	r, _ := up.last(t)
	if r.Header.Get("X-Enqueue") != "0" || r.Header.Get("X-Resolve-Other-Vm") != strconv.Itoa(int(StatusNotFound)) {
		t.Fatalf("enqueue %q, resolve of another vm_id %q", r.Header.Get("X-Enqueue"), r.Header.Get("X-Resolve-Other-Vm"))
	}
	deadline := time.Now().Add(5 * time.Second)
	for metricValue(t, h, "guest_queue_ready") < 1 {
		if time.Now().After(deadline) {
			t.Fatal("proxy_on_queue_ready never ran")
		}
		time.Sleep(time.Millisecond)
	}
	if v, _, _ := h.SharedData("queue-last"); !strings.HasPrefix(string(v), "item from context ") {
		t.Fatalf("dequeued %q", v)
	}
}

func TestRootContextDelaysShutdownUntilProxyDone(t *testing.T) {
	h, _ := newHost(t, Config{Workers: 2, PluginConfig: []byte("delay_done=1\ntick_ms=5")})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	if err := h.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatalf("Close took %v: proxy_done from the tick did not end the wait", time.Since(start))
	}
	if got := metricValue(t, h, "guest_root_done"); got != 2 {
		t.Fatalf("proxy_done succeeded %d times, want once per VM", got)
	}
	if v, _, _ := h.SharedData("root-deleted"); string(v) != "yes" {
		t.Fatal("proxy_on_delete did not run on the root context")
	}
}

func TestRootContextShutdownDeadline(t *testing.T) {
	h, logs := newHost(t, Config{ManualTicks: true, PluginConfig: []byte("delay_done=1")})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := h.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "did not call proxy_done") {
		t.Fatalf("no warning about the missing proxy_done:\n%s", logs)
	}
}

func TestResponseBody(t *testing.T) {
	h, _ := newHost(t, Config{})
	w := serve(NewHandlerProxy(h, &recordingUpstream{}), "GET", "/resp-body", "", nil)
	if w.Body.String() != "<UPSTREAM SAW GET /RESP-BODY>" {
		t.Fatalf("body %q", w.Body)
	}
	if w.Header().Get("Content-Length") != strconv.Itoa(w.Body.Len()) {
		t.Fatalf("content-length %q for %d bytes", w.Header().Get("Content-Length"), w.Body.Len())
	}
}
