package server

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluicehq/sluice/controlplane/internal/degrade"
	"github.com/sluicehq/sluice/controlplane/policy"
	"github.com/sluicehq/sluice/controlplane/store"
	"github.com/sluicehq/sluice/internal/portlock"
	"github.com/sluicehq/sluice/internal/redistest"
)

const testPolicy = `
domain: srv
response_headers: true
descriptors:
  - key: user
    rate_limit: {name: per_user, unit: minute, requests_per_unit: 2}
`

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func policies(t *testing.T) *policy.Set {
	t.Helper()
	d, err := policy.Parse("test.yaml", []byte(testPolicy))
	if err != nil {
		t.Fatal(err)
	}
	set, err := policy.NewSet(d)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// start runs a server on free ports until the test ends; it returns once
// the server is ready.
func start(t *testing.T, cfg Config) *Server {
	t.Helper()
	cfg.GRPCAddr, cfg.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("Run did not return within 15 s of cancel")
		}
	})
	waitUntil(t, "ready", 10*time.Second, func() bool { ok, _ := srv.Ready(); return ok })
	return srv
}

func waitUntil(t *testing.T, what string, limit time.Duration, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > limit {
			t.Fatalf("%s: not within %v", what, limit)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(start)
}

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// clearOfMinuteEnd waits for the next minute when the current one ends
// within 3 s: per_user is 2 a minute in a clock-aligned window, so the few
// calls a test makes to see OK, OK, OVER_LIMIT must fall in one minute.
// The wait is for the wall clock the server reads, not to make a limit's
// time pass.
func clearOfMinuteEnd() {
	now := time.Now()
	if left := now.Truncate(time.Minute).Add(time.Minute).Sub(now); left < 3*time.Second {
		time.Sleep(left + 10*time.Millisecond)
	}
}

func ask(t *testing.T, c rlsv3.RateLimitServiceClient, user string) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "srv", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: user}}},
	}})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func healthOf(t *testing.T, conn *grpc.ClientConn) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: rlsv3.RateLimitService_ServiceDesc.ServiceName})
	if err != nil {
		t.Fatal(err)
	}
	return r.Status
}

// TestServeMemory runs once per decision server (Config.GRPCServer): both
// serve the same decisions and health to grpc-go's client.
func TestServeMemory(t *testing.T) {
	for _, kind := range DecisionServers {
		t.Run(kind, func(t *testing.T) { testServeMemory(t, kind) })
	}
}

func testServeMemory(t *testing.T, kind string) {
	srv := start(t, Config{Policies: policies(t), GRPCServer: kind})
	conn := dial(t, srv.GRPCAddr())
	c := rlsv3.NewRateLimitServiceClient(conn)
	clearOfMinuteEnd()
	codes := []rlsv3.RateLimitResponse_Code{ask(t, c, "a").OverallCode, ask(t, c, "a").OverallCode, ask(t, c, "a").OverallCode}
	if codes[0] != rlsv3.RateLimitResponse_OK || codes[1] != rlsv3.RateLimitResponse_OK || codes[2] != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("codes %v, want OK OK OVER_LIMIT", codes)
	}
	if healthOf(t, conn) != healthpb.HealthCheckResponse_SERVING {
		t.Error("gRPC health not SERVING")
	}
	base := "http://" + srv.HTTPAddr()
	if code, body := get(t, base+"/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("/healthz: %d %q", code, body)
	}
	if code, body := get(t, base+"/readyz"); code != 200 || body != "ready\n" {
		t.Errorf("/readyz: %d %q", code, body)
	}
	code, body := get(t, base+"/metrics")
	for _, want := range []string{
		`sluice_rls_decisions_total{code="OK",domain="srv"} 2`,
		`sluice_rls_decisions_total{code="OVER_LIMIT",domain="srv"} 1`,
		`sluice_rls_request_duration_seconds_count 3`,
		`sluice_memory_entries 1`,
		`go_goroutines`,
	} {
		if code != 200 || !strings.Contains(body, want) {
			t.Errorf("/metrics (%d) lacks %q", code, want)
		}
	}
	if srv.RedisClient() != nil {
		t.Error("a Redis client in memory mode")
	}
}

// TestServeRedisNoFunctions: with NoFunctions the scripts run by EVALSHA
// and no function library is loaded; the gauge says so.
func TestServeRedisNoFunctions(t *testing.T) {
	SetRedisLogger(quiet)
	rs := redistest.StartServer(t)
	srv := start(t, Config{Policies: policies(t), Redis: RedisConfig{Addrs: []string{rs.Addr()}, NoFunctions: true}})
	c := rlsv3.NewRateLimitServiceClient(dial(t, srv.GRPCAddr()))
	for i := range 5 {
		if r := ask(t, c, "user"+strconv.Itoa(i)); r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("decision: %v", r)
		}
	}
	probe := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	defer probe.Close()
	if libs, err := probe.FunctionList(context.Background(), redis.FunctionListQuery{}).Result(); err != nil || len(libs) != 0 {
		t.Errorf("libraries %v (%v), want none", libs, err)
	}
	info := probe.Info(context.Background(), "commandstats").Val()
	if !strings.Contains(info, "cmdstat_evalsha:calls=") || strings.Contains(info, "cmdstat_fcall:") {
		t.Errorf("want EVALSHA calls and no FCALL:\n%s", info)
	}
	if _, m := get(t, "http://"+srv.HTTPAddr()+"/metrics"); !strings.Contains(m, "\nsluice_redis_script_functions 0\n") {
		t.Error("sluice_redis_script_functions is not 0")
	}
}

// TestServeRedisDegrades: decisions go to Redis; with Redis killed they are
// still answered, /readyz stays 200 and says degraded, and gRPC health says
// NOT_SERVING; after a restart both say ready, not degraded.
func TestServeRedisDegrades(t *testing.T) {
	SetRedisLogger(quiet)
	rs := redistest.StartServer(t)
	srv := start(t, Config{Policies: policies(t), Redis: RedisConfig{Addrs: []string{rs.Addr()}}, ProbeInterval: 50 * time.Millisecond,
		Trip: degrade.Trip{Failures: 1}, // the first failure switches (when to switch: degrade's tests)
		// The counts below are of the killed Redis's decisions only: on a
		// busy machine a call to a live Redis passed the default 20 ms.
		Deadline: 10 * time.Second})
	conn := dial(t, srv.GRPCAddr())
	c := rlsv3.NewRateLimitServiceClient(conn)
	if r := ask(t, c, "redis"); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("first call: %v", r)
	}
	probe := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	defer probe.Close()
	// The one decision's key, beside the policy store's.
	keys, err := probe.Keys(context.Background(), store.KeyPrefix+"*").Result()
	var decisionKeys []string
	for _, k := range keys {
		if !strings.HasPrefix(k, "sluice:{policies}:") {
			decisionKeys = append(decisionKeys, k)
		}
	}
	if err != nil || len(decisionKeys) != 1 {
		t.Fatalf("Redis holds decision keys %q (%v), want the one decision's", decisionKeys, err)
	}
	metricsURL := "http://" + srv.HTTPAddr() + "/metrics"
	waitUntil(t, "the scripts called as functions", 5*time.Second, func() bool {
		ask(t, c, "redis")
		_, m := get(t, metricsURL)
		return strings.Contains(m, "\nsluice_redis_script_functions 1\n")
	})
	readyz := "http://" + srv.HTTPAddr() + "/readyz"
	rs.Kill()
	ask(t, c, "redis") // answered from memory
	if code, body := get(t, readyz); code != http.StatusOK || !strings.Contains(body, "degraded: redis unavailable") {
		t.Errorf("/readyz while degraded: %d %q", code, body)
	}
	if healthOf(t, conn) != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Error("gRPC health SERVING while degraded")
	}
	rs.Restart()
	took := waitUntil(t, "ready after restart", 2*time.Second, func() bool { _, body := get(t, readyz); return body == "ready\n" })
	t.Logf("ready %v after the restart", took)
	if healthOf(t, conn) != healthpb.HealthCheckResponse_SERVING {
		t.Error("gRPC health not SERVING after recovery")
	}
	ask(t, c, "redis")
	_, metrics := get(t, "http://"+srv.HTTPAddr()+"/metrics")
	for _, want := range []string{`sluice_store_degraded 0`, `sluice_store_degrade_transitions_total{to="fallback"} 1`, `sluice_store_degraded_decisions_total 1`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

func TestNewErrors(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	cases := []struct {
		name string
		cfg  Config
		want string
	}{
		{"unknown mode", Config{Redis: RedisConfig{Mode: "etcd"}}, `unknown redis mode "etcd"`},
		{"memory with addresses", Config{Redis: RedisConfig{Mode: ModeMemory, Addrs: []string{"x:1"}}}, "takes no Redis addresses"},
		{"standalone without address", Config{Redis: RedisConfig{Mode: ModeStandalone}}, "exactly one address"},
		{"sentinel without master", Config{Redis: RedisConfig{Mode: ModeSentinel, Addrs: []string{"x:1"}}}, "needs the master name"},
		{"cluster with db", Config{Redis: RedisConfig{Mode: ModeCluster, Addrs: []string{"x:1"}, DB: 2}}, "no databases"},
		{"negative deadline", Config{Deadline: -1}, "must not be negative"},
		{"unknown gRPC server", Config{GRPCServer: "netty"}, `GRPCServer "netty": want one of unary, grpc-go`},
		{"address in use", Config{GRPCAddr: taken.Addr().String()}, "gRPC address"},
	}
	for _, c := range cases {
		if c.cfg.GRPCAddr == "" {
			c.cfg.GRPCAddr = "127.0.0.1:0"
		}
		c.cfg.HTTPAddr, c.cfg.Logger = "127.0.0.1:0", quiet
		srv, err := New(c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error containing %q", c.name, err, c.want)
		}
		if srv != nil {
			t.Errorf("%s: a server with an error", c.name)
		}
	}
	// A New that fails on its second listener releases the first: the
	// same gRPC address binds again. The port is reserved, so no other
	// process takes it in between.
	free, err := portlock.Reserve()
	if err != nil {
		t.Fatal(err)
	}
	grpcAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(free))
	if _, err := New(Config{GRPCAddr: grpcAddr, HTTPAddr: taken.Addr().String(), Logger: quiet}); err == nil || !strings.Contains(err.Error(), "HTTP address") {
		t.Fatalf("HTTP address in use: %v", err)
	}
	srv, err := New(Config{GRPCAddr: grpcAddr, HTTPAddr: "127.0.0.1:0", Logger: quiet})
	if err != nil {
		t.Fatalf("the failed New kept %s: %v", grpcAddr, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := srv.Run(ctx); err != nil {
		t.Fatalf("Run with a done context: %v", err)
	}
	if err := srv.Run(ctx); err == nil {
		t.Fatal("second Run did not fail")
	}
}
