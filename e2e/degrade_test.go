package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
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

// TestDegradeCycle measures a degrade and recover cycle on whole processes:
// three control planes on one redis-server (default deadline, default
// degradation settings), 64 gRPC callers spread over them, asking about a
// set of keys of one fixed window far from its end, so that each key may
// admit its limit once in the whole test. It then
//
//   - makes one Redis answer late (DEBUG SLEEP a little past the deadline)
//     and counts the switches to the memory store it caused (goal: 0);
//   - kills Redis (SIGKILL: its counts are lost), lets the replicas decide
//     from their memory stores, restarts Redis and lets them return to it,
//     under load throughout;
//
// and counts what each key admitted over the whole cycle. Goal: at most one
// limit per key beyond its limit (one fleet-wide budget lost to the cycle),
// not one per replica per switch.
func TestDegradeCycle(t *testing.T) {
	needStack(t)
	const planes, callers, keys, limit = 3, 64, 96, 10
	rs := redistest.StartServer(t)
	dir := t.TempDir()
	policy := fmt.Sprintf(`domain: cycle
descriptors:
  - key: k
    rate_limit: {algorithm: fixed_window, window: %s, requests_per_unit: %d}
`, farWindow(t, rs.Addr()), limit)
	policyFile := filepath.Join(dir, "cycle.yaml")
	if err := os.WriteFile(policyFile, []byte(policy), 0o644); err != nil {
		t.Fatal(err)
	}
	var cps []*stack.ControlPlane
	var clients []rlsv3.RateLimitServiceClient
	for i := range planes {
		cp, err := stack.StartControlPlane(context.Background(), stack.ControlPlaneConfig{
			Binary: progs.ControlPlane, Dir: dir, RedisAddr: rs.Addr(), Policies: []string{policyFile},
			// Not the default 20 ms: on a busy machine ordinary calls pass
			// it, and the replicas degrade without the slow answer.
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
	// switches returns the fleet's switches to the memory store so far.
	switches := func() int {
		n := 0.0
		for _, cp := range cps {
			m, err := stack.Scrape(cp.HTTPURL() + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			n += m.Sum("sluice_store_degrade_transitions_total", "to", "fallback")
		}
		return int(n)
	}
	// degraded reports whether every replica's /readyz says degraded, as want.
	degraded := func(want bool) func() bool {
		return func() bool {
			for _, cp := range cps {
				ok, body := cp.Ready()
				if !ok || strings.Contains(body, "degraded") != want {
					return false
				}
			}
			return true
		}
	}

	// One call per replica first, so that the counted calls do not meet
	// cold connections: a call that misses the deadline is answered by the
	// replica's memory store, which before the key's first Redis answers
	// knows nothing of it.
	for _, c := range clients {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "cycle",
			Descriptors: []*rlscommon.RateLimitDescriptor{{Entries: []*rlscommon.RateLimitDescriptor_Entry{{Key: "k", Value: "warm"}}}}})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	admitted := make([]atomic.Int64, keys)
	// phases: the warm-up, the slow answer, Redis down, Redis back.
	var phase atomic.Int32
	var byPhase [4]atomic.Int64
	var calls, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			c := clients[i%planes]
			for n := i; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				k := n % keys
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				r, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
					Domain: "cycle",
					Descriptors: []*rlscommon.RateLimitDescriptor{{
						Entries: []*rlscommon.RateLimitDescriptor_Entry{{Key: "k", Value: fmt.Sprint("key-", k)}},
					}},
				})
				cancel()
				calls.Add(1)
				switch {
				case err != nil:
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				case r.OverallCode == rlsv3.RateLimitResponse_OK:
					admitted[k].Add(1)
					byPhase[phase.Load()].Add(1)
				}
			}
		})
	}
	stopLoad := func() {
		select {
		case <-stop:
		default:
			close(stop)
			wg.Wait()
		}
	}
	t.Cleanup(stopLoad)

	time.Sleep(time.Second) // every key reaches its limit on Redis

	// One slow Redis answer: DEBUG SLEEP holds the server 1.5 x the
	// deadline, past it.
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	before := switches()
	phase.Store(1)
	d, err := time.ParseDuration(cpDeadline)
	if err != nil {
		t.Fatal(err)
	}
	sleep := d * 3 / 2
	if err := rdb.Do(context.Background(), "DEBUG", "SLEEP", fmt.Sprintf("%.3f", sleep.Seconds())).Err(); err != nil {
		t.Fatalf("DEBUG SLEEP: %v", err)
	}
	rdb.Close()
	time.Sleep(time.Second)
	slow := switches() - before
	t.Logf("one slow Redis answer (DEBUG SLEEP %v, deadline %s): %d switches to the memory store over %d replicas", sleep, cpDeadline, slow, planes)

	// The outage: Redis killed (its counts lost), then restarted empty.
	before = switches()
	phase.Store(2)
	rs.Kill()
	killed := time.Now()
	if took, ok := waitFor(5*time.Second, degraded(true)); !ok {
		t.Fatalf("the replicas are not all degraded %v after Redis was killed", took)
	}
	time.Sleep(time.Second) // load on the memory stores
	rs.Restart()
	phase.Store(3)
	if took, ok := waitFor(10*time.Second, degraded(false)); !ok {
		t.Fatalf("the replicas are not all back on Redis %v after its restart", took)
	}
	down := time.Since(killed)
	time.Sleep(time.Second) // load on Redis again
	stopLoad()
	outage := switches() - before

	var over []int64
	var total int64
	for k := range admitted {
		o := max(0, admitted[k].Load()-limit)
		over = append(over, o)
		total += o
	}
	worst := slices.Max(over)
	t.Logf("admitted: %d warming up, %d around the slow answer, %d while Redis was down, %d after its restart",
		byPhase[0].Load(), byPhase[1].Load(), byPhase[2].Load(), byPhase[3].Load())
	t.Logf("cycle (Redis down %v, %d switches to the memory store): %d calls, %d failed; over-admission per key: max %d, total %d over %d keys (limit %d per key)",
		down.Round(time.Millisecond), outage, calls.Load(), failed.Load(), worst, total, keys, limit)
	if f := failed.Load(); f != 0 {
		t.Errorf("%d calls failed, first: %v", f, firstErr.Load())
	}
	if slow != 0 {
		t.Errorf("one slow Redis answer caused %d switches to the memory store, want 0", slow)
	}
	if worst > limit {
		t.Errorf("a key admitted %d over its limit of %d across the cycle, want at most one limit", worst, limit)
	}
}
