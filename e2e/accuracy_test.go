package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlscommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/e2e/stack"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestAccuracyThreeControlPlanes checks accuracy on whole processes: three
// control planes on one Redis, 64 gRPC callers spread over them, and one
// descriptor per exact algorithm asked about twice its limit. No capacity
// comes back during the test (the fixed window is aligned far from its end,
// the others refill one request an hour), so each must admit exactly its
// limit: none over, none under.
func TestAccuracyThreeControlPlanes(t *testing.T) {
	needStack(t)
	const planes, callers, limit = 3, 64, 300
	const perCaller = 2*limit/callers + 1 // about twice the limit in all
	rs := redistest.StartServer(t)
	dir := t.TempDir()
	policy := fmt.Sprintf(`domain: accuracy
descriptors:
  - key: alg
    value: fixed_window
    rate_limit: {algorithm: fixed_window, window: %s, requests_per_unit: %d}
  - key: alg
    value: sliding_log
    rate_limit: {algorithm: sliding_log, unit: hour, requests_per_unit: %d}
  - key: alg
    value: token_bucket
    rate_limit: {algorithm: token_bucket, unit: hour, requests_per_unit: 1, burst: %d}
  - key: alg
    value: gcra
    rate_limit: {algorithm: gcra, unit: hour, requests_per_unit: 1, burst: %d}
`, farWindow(t, rs.Addr()), limit, limit, limit, limit)
	policyFile := filepath.Join(dir, "accuracy.yaml")
	if err := os.WriteFile(policyFile, []byte(policy), 0o644); err != nil {
		t.Fatal(err)
	}
	var clients []rlsv3.RateLimitServiceClient
	var cps []*stack.ControlPlane
	for i := range planes {
		// The Redis deadline of the other scenarios: at the default (20 ms)
		// a busy machine degrades a replica to its memory store, which then
		// admits the limit again on its own.
		cp, err := stack.StartControlPlane(context.Background(), stack.ControlPlaneConfig{
			Binary: progs.ControlPlane, Dir: dir, RedisAddr: rs.Addr(), Policies: []string{policyFile},
			Args: []string{"-deadline", cpDeadline},
		})
		if err != nil {
			t.Fatalf("control plane %d: %v", i, err)
		}
		t.Cleanup(func() { cp.Stop() })
		cps = append(cps, cp)
		conn, err := grpc.NewClient(cp.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		clients = append(clients, rlsv3.NewRateLimitServiceClient(conn))
	}

	algs := []string{"fixed_window", "sliding_log", "token_bucket", "gcra"}
	admitted := make([]atomic.Int64, len(algs))
	var wg sync.WaitGroup
	var failed atomic.Value
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := clients[i%planes]
			for n := range perCaller * len(algs) {
				a := (i + n) % len(algs) // callers interleave the descriptors
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				r, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
					Domain: "accuracy",
					Descriptors: []*rlscommon.RateLimitDescriptor{{
						Entries: []*rlscommon.RateLimitDescriptor_Entry{{Key: "alg", Value: algs[a]}},
					}},
				})
				cancel()
				if err != nil {
					failed.CompareAndSwap(nil, err.Error())
					return
				}
				if r.OverallCode == rlsv3.RateLimitResponse_OK {
					admitted[a].Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if f := failed.Load(); f != nil {
		t.Fatalf("a call failed: %v", f)
	}
	var degraded float64
	for i, cp := range cps {
		m, err := stack.Scrape(cp.HTTPURL() + "/metrics")
		if err != nil {
			t.Fatalf("control plane %d: %v", i, err)
		}
		degraded += m.Sum("sluice_store_degraded_decisions_total")
	}
	if degraded != 0 {
		t.Errorf("%v decisions were made degraded (memory store, per replica): Redis was slower than %s", degraded, cpDeadline)
	}
	for a, alg := range algs {
		got := admitted[a].Load()
		t.Logf("%s: %d admitted of %d asked, limit %d", alg, got, callers*perCaller, limit)
		if got != limit {
			t.Errorf("%s: %d admitted, want exactly %d", alg, got, limit)
		}
	}
}

// farWindow returns redistest.FarWindow for the time of the Redis at addr,
// as a policy window ("25h").
func farWindow(t *testing.T, addr string) string {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	now, err := c.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%dh", int(redistest.FarWindow(t, now).Hours()))
}
