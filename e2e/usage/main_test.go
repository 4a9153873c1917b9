package usage

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	rlscommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/e2e/stack"
	"github.com/sluicehq/sluice/internal/redistest"
)

// Built by TestMain.
var (
	controlPlane string
	filters      []stack.Filter // the filter on each of its hosts
)

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(stack.RunWithControlPlane("e2e/usage", testing.Short(), &controlPlane, &filters, m.Run))
}

const (
	domain    = "usage"
	keyHeader = "x-api-key"
	workers   = 2 // Envoy's --concurrency: one Wasm VM each
)

// Limits of policy.
const (
	minuteLimit = 250           // api_key: tokens a minute, the README's example
	exactLimit  = 1_000_000_000 // exact_key: never reached, so a probe's remaining tells the charged total
	boundLimit  = 1000          // bound_key, envoyrl_key: tokens a day
	discLimit   = 1_000_000     // disc_key
)

// policy is what every control plane serves. Keys are fresh per test, and
// the windows other than the README's minute are days, so that counts are
// exact whatever the test's speed; the minute test reruns with a fresh key
// when its requests straddle a window boundary (windows are aligned to the
// clock).
var policy = fmt.Sprintf(`
domain: usage
descriptors:
  - key: api_key
    rate_limit: {name: tokens, algorithm: fixed_window, unit: minute, requests_per_unit: %d}
  - key: exact_key
    rate_limit: {name: exact, algorithm: fixed_window, unit: day, requests_per_unit: %d}
  - key: bound_key
    rate_limit: {name: bound, algorithm: fixed_window, unit: day, requests_per_unit: %d}
  - key: envoyrl_key
    charge_past_limit: true
    rate_limit: {name: envoyrl, algorithm: fixed_window, unit: day, requests_per_unit: %d}
  - key: disc_key
    rate_limit: {name: disc, algorithm: fixed_window, unit: day, requests_per_unit: %d}
`, minuteLimit, exactLimit, boundLimit, boundLimit, discLimit)

// Control-plane clusters of the Envoy.
const (
	cpMemory = "cp_memory" // embedded memory store
	cpRedis  = "cp_redis"  // Redis
	cpKill   = "cp_kill"   // Redis, killed and restarted by TestUsageEnvoy/killed
)

// Listeners of the Envoy, and what their filter configuration is.
const (
	lnHeader      = "header"       // api_key, reserve 0, usage from the response header (memory)
	lnTrailer     = "trailer"      // api_key, reserve 0, usage from the response trailer (memory)
	lnExact       = "exact"        // exact_key, reserve 0, trailer (Redis)
	lnBound       = "bound"        // bound_key, reserve boundReserve, header (Redis)
	lnEnvoyRL     = "envoyrl"      // Envoy's ratelimit filter, apply_on_stream_done, envoyrl_key (Redis)
	lnKill        = "kill"         // exact_key, reserve 0, trailer, small queue (cp_kill)
	lnDiscBytes   = "disc-bytes"   // disc_key, reserve 0, trailer, on_disconnect bytes (memory)
	lnDiscReserve = "disc-reserve" // disc_key, reserve discReserve, trailer, on_disconnect reserve (memory)
)

// Reserves and queue bound of the listeners.
const (
	boundReserve = 100
	discReserve  = 7
	killQueueMax = 8 // settlements waiting per VM
	killBatchMax = 4 // settlements per call: few leave the queue for a call that fails
)

// env is the stack the tests share: a memory-store control plane, two
// control planes on one redis-server, a UsageUpstream, and one Envoy with a
// listener per configuration (one Wasm VM per worker runs them all).
type env struct {
	filter stack.Filter // the filter, on one of its hosts
	dir    string
	cps    map[string]*stack.ControlPlane // by cluster name
	up     *stack.UsageUpstream
	envoy  *stack.Envoy
	client *http.Client
}

// startEnv starts the stack with filter f; everything stops when t ends.
func startEnv(t *testing.T, f stack.Filter) *env {
	return startStack(t, f, spec{policies: map[string]string{"usage.yaml": policy}, listeners: listeners})
}

// spec is what a stack serves: policy files (by name), and the Envoy's
// listeners running a filter, and clusters other than the control planes'
// and the upstream's (named as a configuration names them).
type spec struct {
	policies  map[string]string
	listeners func(stack.Filter) []stack.M
	aliases   map[string]string // cluster name -> the control plane it reaches
}

// startStack starts the stack of s with filter f; everything stops when t
// ends.
func startStack(t *testing.T, f stack.Filter, s spec) *env {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end: skipped in -short mode")
	}
	ctx := context.Background()
	e := &env{filter: f, dir: t.TempDir(), cps: map[string]*stack.ControlPlane{}}
	var pols []string
	for name, text := range s.policies {
		pol := filepath.Join(e.dir, name)
		if err := os.WriteFile(pol, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		pols = append(pols, pol)
	}
	rs := redistest.StartServer(t)
	for _, c := range []struct{ name, redis string }{{cpMemory, ""}, {cpRedis, rs.Addr()}, {cpKill, rs.Addr()}} {
		cfg := stack.ControlPlaneConfig{Binary: controlPlane, Dir: e.dir, Policies: pols, RedisAddr: c.redis}
		if c.redis != "" {
			cfg.Args = []string{"-deadline", "500ms"} // two busy cores: no degrading mid-count
		}
		cp, err := stack.StartControlPlane(ctx, cfg)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		e.cps[c.name] = cp
		t.Cleanup(func() {
			cp.Stop()
			if t.Failed() {
				b, _ := os.ReadFile(cp.LogPath())
				t.Logf("%s's log (%s):\n%s", c.name, cp.LogPath(), lastLines(string(b), 30))
			}
		})
	}
	up, err := stack.StartUsageUpstream("127.0.0.1:0", keyHeader)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close(ctx) })
	e.up = up

	clusters := []stack.M{h2Cluster("up", up.Addr())}
	for name, cp := range e.cps {
		clusters = append(clusters, stack.GRPCCluster(name, cp.GRPCAddr()))
	}
	for alias, cp := range s.aliases {
		clusters = append(clusters, stack.GRPCCluster(alias, e.cps[cp].GRPCAddr()))
	}
	lns := s.listeners(f)
	boot := stack.Bootstrap(lns, clusters)
	start := time.Now()
	envoy, err := stack.StartEnvoy(ctx, stack.EnvoyConfig{Dir: e.dir, Bootstrap: boot, Concurrency: workers,
		LogLevel: "warn", Args: []string{"--component-log-level", "wasm:info"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Envoy (%s filter, %d workers, %d listeners) started in %v", f.Host.Name, workers, len(lns), time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("Envoy's log (%s):\n%s", envoy.LogPath(), envoy.LogExcerpt())
		}
		envoy.Stop()
	})
	e.envoy = envoy
	e.client = &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 128}}
	t.Cleanup(e.client.CloseIdleConnections)
	return e
}

// h2Cluster returns a cluster speaking HTTP/2 without TLS to addr: the
// upstream's trailers reach Envoy's filters whatever the downstream
// protocol.
func h2Cluster(name, addr string) stack.M {
	c := stack.GRPCCluster(name, addr)
	c["connect_timeout"] = "1s"
	return c
}

// usagePlugin returns the filter configuration of one usage-based rate
// limit whose descriptor is key from the x-api-key header, calling cluster.
func usagePlugin(cluster, key string, u stack.Usage) stack.PluginConfig {
	return stack.PluginConfig{
		Cluster: cluster, Domain: domain, Timeout: "1s", FailureMode: "closed",
		RateLimits: []stack.RateLimit{{Actions: []stack.Action{stack.RequestHeader(keyHeader, key)}, Usage: &u}},
		Precheck:   &stack.Precheck{Enabled: true},
		Headers:    &stack.Headers{Draft10: true, RetryAfter: true},
	}
}

var (
	fromHeader  = stack.M{"response_header": stack.UsageReportHeader}
	fromTrailer = stack.M{"response_trailer": stack.UsageReportHeader}
)

// listeners returns the Envoy's listeners (see the ln* constants), with
// filter f.
func listeners(f stack.Filter) []stack.M {
	kill := usagePlugin(cpKill, "exact_key", stack.Usage{Reserve: stack.Int(0), Source: fromTrailer})
	kill.Settle = &stack.Settle{BatchMax: stack.Int(killBatchMax), QueueMax: stack.Int(killQueueMax), TimeoutMS: stack.Int(500)}
	return []stack.M{
		filterListener(f, lnHeader, usagePlugin(cpMemory, "api_key", stack.Usage{Reserve: stack.Int(0), Source: fromHeader})),
		filterListener(f, lnTrailer, usagePlugin(cpMemory, "api_key", stack.Usage{Reserve: stack.Int(0), Source: fromTrailer})),
		filterListener(f, lnExact, usagePlugin(cpRedis, "exact_key", stack.Usage{Reserve: stack.Int(0), Source: fromTrailer})),
		filterListener(f, lnBound, usagePlugin(cpRedis, "bound_key", stack.Usage{Reserve: stack.Int(boundReserve), Source: fromHeader})),
		filterListener(f, lnKill, kill),
		filterListener(f, lnDiscBytes, usagePlugin(cpMemory, "disc_key",
			stack.Usage{Reserve: stack.Int(0), Source: fromTrailer, OnDisconnect: "bytes"})),
		filterListener(f, lnDiscReserve, usagePlugin(cpMemory, "disc_key",
			stack.Usage{Reserve: stack.Int(discReserve), Source: fromTrailer, OnDisconnect: "reserve"})),
		envoyRateLimitListener(lnEnvoyRL, cpRedis),
	}
}

// route returns the route of every path to the upstream, without a
// response timeout (held streams last as long as a test holds them).
func route() stack.M {
	r := stack.RouteTo("/", "up")
	r["route"].(stack.M)["timeout"] = "0s"
	return r
}

// filterListener returns listener name running filter f with pc, under a
// plugin name of its own.
func filterListener(f stack.Filter, name string, pc stack.PluginConfig) stack.M {
	return stack.HTTPListener(name, 0, []stack.M{stack.VirtualHost("all", route())}, f.HTTPFilter("sluice-"+name, pc.JSON()))
}

// envoyRateLimitListener returns listener name running Envoy's own ratelimit
// filter the way Envoy Gateway configures a response cost (and Envoy AI
// Gateway its token limits): a request-time rate limit whose descriptor has
// hits_addend 0, and the same descriptor again with apply_on_stream_done
// and hits_addend from dynamic metadata, which a Lua filter sets from the
// upstream's x-usage-tokens (e2e/envoyratelimit's TestResponseCostEnvoy runs the
// same configuration).
func envoyRateLimitListener(name, cluster string) stack.M {
	key := []stack.M{{"request_headers": stack.M{"header_name": keyHeader, "descriptor_key": "envoyrl_key"}}}
	r := route()
	lua := stack.ResponseCost(r, key, stack.UsageReportHeader)
	rl := stack.RateLimitFilter(domain, cluster, stack.M{
		"enable_x_ratelimit_headers":         "DRAFT_VERSION_03",
		"disable_x_envoy_ratelimited_header": true,
	})
	return stack.HTTPListener(name, 0, []stack.M{stack.VirtualHost("all", r)}, lua, rl)
}

// request describes one request to a listener.
type request struct {
	key    string // x-api-key
	tokens int    // usage the upstream reports
	mode   string // "header" or "trailer"
	hold   string // gate the upstream waits on after the first chunk ("" for none)
}

// newRequest returns the HTTP request r to listener ln.
func (e *env) newRequest(ctx context.Context, ln string, r request) *http.Request {
	req, err := http.NewRequestWithContext(ctx, "GET", e.envoy.URL(ln)+"/v1/chat/completions", nil)
	if err != nil {
		panic(err) // a constant URL
	}
	req.Header.Set(keyHeader, r.key)
	req.Header.Set(stack.UsageTokensHeader, strconv.Itoa(r.tokens))
	if r.mode != "" {
		req.Header.Set(stack.UsageModeHeader, r.mode)
	}
	if r.hold != "" {
		req.Header.Set(stack.UsageHoldHeader, r.hold)
	}
	return req
}

// filterStat returns one of the filter's counters (Envoy's /stats shows
// them under the host's prefix, one counter shared by the workers and
// plugins).
func (e *env) filterStat(name string) int64 { return e.envoy.Stat(e.filter.Stat(name)) }

// waitStat polls the filter's counter name until it reaches at least want
// or d passes, and returns its last value.
func (e *env) waitStat(name string, want int64, d time.Duration) int64 {
	var v int64
	for deadline := time.Now().Add(d); ; time.Sleep(20 * time.Millisecond) {
		if v = e.filterStat(name); v >= want || time.Now().After(deadline) {
			return v
		}
	}
}

// charged returns what control plane cluster cp has charged descriptor
// key=value of a limit, read with a probe (a descriptor cost of 0): the
// limit minus the remaining. Only exact for limits not yet reached.
func (e *env) charged(t *testing.T, cp, key, value string, limit int64) int64 {
	t.Helper()
	return e.chargedIn(t, cp, domain, key, value, limit)
}

// chargedIn is charged for a descriptor of domain dom.
func (e *env) chargedIn(t *testing.T, cp, dom, key, value string, limit int64) int64 {
	t.Helper()
	conn, err := grpc.NewClient(e.cps[cp].GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
		Domain: dom,
		Descriptors: []*rlscommon.RateLimitDescriptor{{
			Entries:    []*rlscommon.RateLimitDescriptor_Entry{{Key: key, Value: value}},
			HitsAddend: wrapperspb.UInt64(0),
		}},
	})
	if err != nil {
		t.Fatalf("probe %s=%s on %s: %v", key, value, cp, err)
	}
	st := r.GetStatuses()[0]
	if st.GetCurrentLimit().GetRequestsPerUnit() != uint32(limit) {
		t.Fatalf("probe %s=%s on %s: limit %d, want %d", key, value, cp, st.GetCurrentLimit().GetRequestsPerUnit(), limit)
	}
	return limit - int64(st.GetLimitRemaining())
}

// waitCharged polls charged until it reaches at least want or d passes,
// and returns its last value.
func (e *env) waitCharged(t *testing.T, cp, key, value string, limit, want int64, d time.Duration) int64 {
	t.Helper()
	for deadline := time.Now().Add(d); ; time.Sleep(20 * time.Millisecond) {
		if v := e.charged(t, cp, key, value, limit); v >= want || time.Now().After(deadline) {
			return v
		}
	}
}

// cpMetric returns the sum of a control plane's metric name over the
// samples whose labels match (alternating names and values).
func (e *env) cpMetric(t *testing.T, cp, name string, match ...string) float64 {
	t.Helper()
	s, err := stack.Scrape(e.cps[cp].HTTPURL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	return s.Sum(name, match...)
}

// freshKey returns an API key no earlier run has used.
func freshKey(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano())
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// untilMidnight is how long the day windows (aligned to UTC midnight) have
// left.
func untilMidnight(now time.Time) time.Duration {
	return now.Truncate(24 * time.Hour).Add(24 * time.Hour).Sub(now)
}
