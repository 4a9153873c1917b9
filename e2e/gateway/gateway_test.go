package gateway

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

	"github.com/sluicehq/sluice/e2e/stack"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/testcerts"
	"github.com/sluicehq/sluice/internal/xdstest"
)

// nodeID is the node Envoy Gateway serves rate limit configuration to.
const nodeID = "envoy-ratelimit"

// xdsServerName stands for Envoy Gateway's "envoy-gateway": the name the
// test certificates hold, set with CONFIG_GRPC_XDS_SERVER_TLS_SAN as a
// standalone deployment must.
const xdsServerName = "sluice.test"

// knownDifferences are the scenarios where envoyproxy/ratelimit is known to
// answer otherwise than sluice, each with the README's reason. Any other
// difference fails the test.
var knownDifferences = map[string]string{}

// service is one rate limit service under test.
type service struct {
	name string
	bin  string
}

// TestEnvoyGatewayDropIn runs every scenario against sluice and against
// envoyproxy/ratelimit, each started as Envoy Gateway's ratelimit
// Deployment would start it.
func TestEnvoyGatewayDropIn(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Envoy, Redis and two rate limit services")
	}
	got := map[string]map[string]string{}
	for _, s := range []service{{"sluice", sluiceBin}, {"envoyproxy/ratelimit", peerBin}} {
		res := map[string]string{}
		got[s.name] = res
		t.Run(strings.ReplaceAll(s.name, "/", "-"), func(t *testing.T) { runScenarios(t, s, res) })
	}
	for scenario, want := range got["sluice"] {
		peer, ok := got["envoyproxy/ratelimit"][scenario]
		switch {
		case !ok:
		case peer == want:
			t.Logf("%-28s both: %s", scenario, want)
		case knownDifferences[scenario] != "":
			t.Logf("%-28s sluice: %s; envoyproxy/ratelimit: %s (known: %s)", scenario, want, peer, knownDifferences[scenario])
		default:
			t.Errorf("%-28s sluice: %s; envoyproxy/ratelimit: %s: a sluice defect or an undocumented difference", scenario, want, peer)
		}
	}
}

// env is Envoy Gateway's ratelimit container environment
// (internal/infrastructure/kubernetes/ratelimit/resource.go), with paths and
// ports adapted to the test.
type env struct {
	runtimeRoot, xdsURL, redis string
	port, grpcPort, debugPort  int
	promPort                   int
	pki                        *pkiFiles
}

func (e env) list() []string {
	return []string{
		"RUNTIME_ROOT=" + e.runtimeRoot, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_IGNOREDOTFILES=true",
		"RUNTIME_WATCH_ROOT=false", "LOG_LEVEL=info", "USE_STATSD=false",
		"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL=" + e.xdsURL, "CONFIG_GRPC_XDS_NODE_ID=" + nodeID,
		"GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT=" + e.pki.rlCert, "GRPC_SERVER_TLS_KEY=" + e.pki.rlKey,
		"GRPC_SERVER_TLS_CA_CERT=" + e.pki.ca,
		"CONFIG_GRPC_XDS_SERVER_USE_TLS=true", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT=" + e.pki.rlCert,
		"CONFIG_GRPC_XDS_CLIENT_TLS_KEY=" + e.pki.rlKey, "CONFIG_GRPC_XDS_SERVER_TLS_CACERT=" + e.pki.ca,
		"CONFIG_GRPC_XDS_SERVER_TLS_SAN=" + xdsServerName,
		"FORCE_START_WITHOUT_INITIAL_CONFIG=true",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + e.redis,
		"USE_PROMETHEUS=true", "PROMETHEUS_ADDR=127.0.0.1:" + strconv.Itoa(e.promPort),
		// Adapted: ports, and loopback only.
		"HOST=127.0.0.1", "PORT=" + strconv.Itoa(e.port), "GRPC_HOST=127.0.0.1", "GRPC_PORT=" + strconv.Itoa(e.grpcPort),
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + strconv.Itoa(e.debugPort),
		// Adapted: reconnect within seconds after the xDS server restarts
		// (the default first wait is 10 s).
		"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL=500ms", "XDS_CLIENT_BACKOFF_MAX_INTERVAL=2s",
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	p, err := stack.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// start runs bin with the environment e until the test ends.
func start(t *testing.T, bin string, e env, logPath string) {
	t.Helper()
	startEnv(t, bin, e.list(), logPath)
}

// startEnv runs bin with the environment vars (and PATH, HOME) until the
// test ends, its output in logPath.
func startEnv(t *testing.T, bin string, vars []string, logPath string) {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}, vars...)
	runLogged(t, cmd, logPath, 15*time.Second, func(sig syscall.Signal) { cmd.Process.Signal(sig) })
}

// runLogged starts cmd, its output in logPath, and stops it when the test
// ends: signal(SIGTERM), then signal(SIGKILL) if it has not exited within
// grace. When the test failed, the tail of the log is logged.
func runLogged(t *testing.T, cmd *exec.Cmd, logPath string, grace time.Duration, signal func(syscall.Signal)) {
	t.Helper()
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(grace):
			signal(syscall.SIGKILL)
			<-done
		}
		log.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("%s log:\n%s", cmd.Path, tailOf(string(b), 6000))
		}
	})
}

func tailOf(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// client sends requests through Envoy.
type client struct {
	t    *testing.T
	base string
	http *http.Client
}

// do sends one request and returns its status and headers.
func (c *client) do(method, path string, hdr ...string) (int, http.Header) {
	c.t.Helper()
	req, err := http.NewRequest(method, c.base+path, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.http.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header
}

// statuses sends the requests in turn and returns their statuses, joined.
func (c *client) statuses(reqs ...[]string) string {
	c.t.Helper()
	var out []string
	for _, r := range reqs {
		code, _ := c.do(r[0], r[1], r[2:]...)
		out = append(out, strconv.Itoa(code))
	}
	return strings.Join(out, ",")
}

func times(n int, req ...string) [][]string {
	out := make([][]string, n)
	for i := range out {
		out[i] = req
	}
	return out
}

// waitFor polls cond every 50 ms for up to limit and returns how long it
// took, failing the test if it never held.
func waitFor(t *testing.T, what string, limit time.Duration, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > limit {
			t.Fatalf("%s: not within %v", what, limit)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return time.Since(start)
}

// acked reports whether the xDS server has had an ACK of version from the
// node.
func acked(srv *xdstest.Server, version string) bool {
	reqs, _ := srv.Requests()
	for _, r := range reqs {
		if r.GetNode().GetId() == nodeID && r.GetVersionInfo() == version && r.GetErrorDetail() == nil && r.GetResponseNonce() != "" {
			return true
		}
	}
	return false
}

// nack returns the first NACK received after skip requests, or nil.
func nack(srv *xdstest.Server, skip int) *discoveryv3.DiscoveryRequest {
	reqs, _ := srv.Requests()
	for _, r := range reqs[min(skip, len(reqs)):] {
		if r.GetErrorDetail() != nil {
			return r
		}
	}
	return nil
}

func runScenarios(t *testing.T, s service, res map[string]string) {
	dir := t.TempDir()
	certs := testcerts.New(t)
	envoyCert, envoyKey := certs.CA.Issue(t, "envoy", false)
	pki := &pkiFiles{ca: certs.CA.File, rlCert: certs.ServerCert, rlKey: certs.ServerKey, envoyCert: envoyCert, envoyKey: envoyKey}
	cert, err := tls.LoadX509KeyPair(certs.ServerCert, certs.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	xdsTLS := &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: certs.CA.Pool,
		ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13}
	xds := xdstest.Start(t, "127.0.0.1:0", nodeID, xdsTLS)
	v1 := xds.Set(t, snapshot(nil, nil)...)

	redis := redistest.StartServer(t)
	up, err := stack.StartUpstream("127.0.0.1:0", "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close(context.Background()) })
	e := env{runtimeRoot: filepath.Join(dir, "data"), xdsURL: xds.Addr, redis: redis.Addr(),
		port: freePort(t), grpcPort: freePort(t), debugPort: freePort(t), promPort: freePort(t), pki: pki}
	os.MkdirAll(filepath.Join(e.runtimeRoot, "ratelimit"), 0o755)
	start(t, s.bin, e, filepath.Join(dir, "ratelimit.log"))

	hc := &http.Client{Timeout: 10 * time.Second}
	health := fmt.Sprintf("http://127.0.0.1:%d/healthcheck", e.port)
	waitFor(t, "healthcheck 200", time.Minute, func() bool {
		resp, err := hc.Get(health)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	waitFor(t, "first snapshot ACKed", time.Minute, func() bool { return acked(xds, v1) })

	ev, err := stack.StartEnvoy(context.Background(), stack.EnvoyConfig{Dir: dir,
		Bootstrap: bootstrap(up.Addr(), fmt.Sprintf("127.0.0.1:%d", e.grpcPort), pki)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ev.Stop() })
	c := &client{t: t, base: ev.URL(listenerName), http: hc}

	check := func(scenario, got, want string) {
		t.Helper()
		res[scenario] = got
		if got != want && (s.name == "sluice" || knownDifferences[scenario] == "") {
			t.Errorf("%s: got %s, want %s", scenario, got, want)
		}
	}

	// The headers Envoy builds from the answer (DRAFT_VERSION_03).
	code, h := c.do("GET", "/header", "x-user-id", "one")
	check("headers", fmt.Sprintf("%d limit=%q remaining=%q", code, h.Get("x-ratelimit-limit"), h.Get("x-ratelimit-remaining")),
		`200 limit="3, 3;w=3600" remaining="2"`)
	check("header match 3/hour", "200,"+c.statuses(times(3, "GET", "/header", "x-user-id", "one")...), "200,200,200,429")
	check("header no match", c.statuses(times(2, "GET", "/header", "x-user-id", "two")...), "200,200")
	check("distinct", c.statuses(append(times(3, "GET", "/distinct", "x-user-id", "alice"), []string{"GET", "/distinct", "x-user-id", "bob"})...), "200,200,429,200")
	check("cidr", c.statuses(times(3, "GET", "/cidr")...), "200,200,429")
	check("method and path", c.statuses(append(times(3, "GET", "/method-path/x"), []string{"POST", "/method-path/x"}, []string{"GET", "/method-path/y"})...), "200,200,429,200,200")
	check("route-wide", c.statuses(times(4, "GET", "/all")...), "200,200,200,429")
	check("shared rule", c.statuses([]string{"GET", "/shared-a"}, []string{"GET", "/shared-b"}, []string{"GET", "/shared-a"}, []string{"GET", "/shared-b"}), "200,200,200,429")
	check("shadow mode", c.statuses(times(3, "GET", "/shadow")...), "200,200,200")
	code, h = c.do("GET", "/cost")
	check("cost headers", fmt.Sprintf("%d limit=%q remaining=%q", code, h.Get("x-ratelimit-limit"), h.Get("x-ratelimit-remaining")),
		`200 limit="21, 21;w=3600" remaining="11"`)
	check("request cost 10 of 21", "200,"+c.statuses(times(2, "GET", "/cost")...), "200,200,429")
	check("shadow counted", shadowCounted(t, hc, e.promPort), "counted")

	// A new snapshot takes effect: /late gets a limit of 1.
	before := c.statuses(times(2, "GET", "/late")...)
	v2 := xds.Set(t, snapshot([]string{"late"}, nil)...)
	took := waitFor(t, "the new snapshot in force", 30*time.Second, func() bool {
		code, _ := c.do("GET", "/late")
		return code == 429
	})
	t.Logf("%s: a new snapshot was in force %v after it was published", s.name, took.Round(time.Millisecond))
	if took > 5*time.Second {
		t.Errorf("new snapshot: in force after %v, want within about 1 s (5 s allowed on a busy machine)", took)
	}
	check("before and after a snapshot", before+" then 429", "200,200 then 429")
	waitFor(t, "second snapshot ACKed", 30*time.Second, func() bool { return acked(xds, v2) })

	// An invalid snapshot is NACKed whole: its valid change (/all to 100)
	// is not applied, and the old policies keep working.
	reqs, _ := xds.Requests()
	bad := append(snapshot([]string{"late"}, map[string]uint32{"all": 100}),
		xdstest.Config("default/bad", xdstest.RouteDescriptor("r", xdstest.Rule{Requests: 1, Unit: rlsconfv3.RateLimitUnit_UNKNOWN})))
	xds.Set(t, bad...)
	waitFor(t, "NACK", 30*time.Second, func() bool { return nack(xds, len(reqs)) != nil })
	n := nack(xds, len(reqs))
	t.Logf("%s: NACK version %q error_detail %q", s.name, n.GetVersionInfo(), n.GetErrorDetail().GetMessage())
	nacked := "nacked"
	if n.GetVersionInfo() != v2 {
		nacked += " (version " + n.GetVersionInfo() + ")"
	}
	check("invalid snapshot NACKed", nacked, "nacked")
	check("old policies after a NACK", c.statuses([]string{"GET", "/header", "x-user-id", "one"}, []string{"GET", "/all"}, []string{"GET", "/late"}), "429,429,429")

	// The xDS server restarts, its version counter from 1 again: the
	// service keeps serving meanwhile, then subscribes again.
	addr := xds.Addr
	xds.Stop()
	check("serving while xDS is down", c.statuses([]string{"GET", "/header", "x-user-id", "one"}, []string{"GET", "/distinct", "x-user-id", "carol"}), "429,200")
	xds2 := xdstest.Start(t, addr, nodeID, xdsTLS)
	xds2.SetVersion(t, "1", snapshot([]string{"late", "late2"}, nil)...)
	took = waitFor(t, "resubscribed after the restart", time.Minute, func() bool {
		code, _ := c.do("GET", "/late2")
		return code == 429
	})
	t.Logf("%s: resubscribed and applied %v after the restart", s.name, took.Round(time.Millisecond))
	check("resubscribed after restart", "ok", "ok")
}

// shadowCounted reports whether the service's Prometheus metrics count the
// shadow-mode requests over the limit, within 30 s (envoyproxy/ratelimit
// flushes its statistics every STATS_FLUSH_INTERVAL, 10 s).
func shadowCounted(t *testing.T, hc *http.Client, port int) string {
	var got string
	for start := time.Now(); time.Since(start) < 30*time.Second; time.Sleep(250 * time.Millisecond) {
		if got = shadowCountedNow(t, hc, port); got == "counted" {
			break
		}
	}
	return got
}

func shadowCountedNow(t *testing.T, hc *http.Client, port int) string {
	resp, err := hc.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
	if err != nil {
		return "no metrics: " + err.Error()
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	re := regexp.MustCompile(`(?m)^([a-zA-Z_:]*shadow[a-zA-Z_:]*)(\{[^}]*\})? ([0-9.e+]+)$`)
	for _, m := range re.FindAllStringSubmatch(string(b), -1) {
		if v, _ := strconv.ParseFloat(m[3], 64); v >= 2 {
			t.Logf("shadow metric: %s%s %s", m[1], m[2], m[3])
			return "counted"
		}
	}
	return "not counted"
}
