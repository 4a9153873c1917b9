package degrade

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/store"
	"github.com/sluicehq/sluice/controlplane/store/memory"
	redisstore "github.com/sluicehq/sluice/controlplane/store/redis"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestRedisKilled runs decisions under load against a real redis-server,
// kills it with SIGKILL, and restarts it: every call must be answered, the
// store must degrade within 1 s of the kill and be back on Redis within 2 s
// of the restart.
func TestRedisKilled(t *testing.T) {
	redis.SetLogger(discard{}) // go-redis logs every failed dial otherwise
	srv := redistest.StartServer(t)
	client := redis.NewClient(&redis.Options{
		Addr:                  srv.Addr(),
		ContextTimeoutEnabled: true,
		DialTimeout:           200 * time.Millisecond,
		ReadTimeout:           100 * time.Millisecond,
		WriteTimeout:          100 * time.Millisecond,
		DialerRetries:         1,
		PoolSize:              4, // go-redis stops dialing after PoolSize failed dials
	})
	t.Cleanup(func() { client.Close() })
	primary, err := redisstore.New(client, redisstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(primary, memory.New(memory.Options{}), Options{
		Probe:         func(ctx context.Context) error { return client.Ping(ctx).Err() },
		ProbeInterval: 100 * time.Millisecond,
		// A kill shows as connection errors, not slowness: a generous
		// deadline keeps a loaded test machine from degrading early.
		Deadline:     250 * time.Millisecond,
		TrustContext: true, // as the server runs it
		Logger:       quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)

	var calls, failures, degradedCalls atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			checks := []store.Check{{
				Key:   store.Key("fault", []store.Entry{{Key: "worker", Value: fmt.Sprint(w)}}, "l#0", algorithms.KindFixedWindow),
				Limit: store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 1 << 30, Window: time.Hour},
				Cost:  1,
			}}
			out := make([]algorithms.Result, 1)
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := s.Decide(context.Background(), checks, out); err != nil {
					failures.Add(1)
					firstErr.CompareAndSwap(nil, err)
				} else if !out[0].Allowed {
					failures.Add(1)
				}
				if s.Degraded() {
					degradedCalls.Add(1)
				}
				calls.Add(1)
			}
		}()
	}
	waitCalls := func(n int64) {
		t.Helper()
		target := calls.Load() + n
		deadline := time.Now().Add(10 * time.Second)
		for calls.Load() < target {
			if time.Now().After(deadline) {
				t.Fatalf("no progress: %d calls", calls.Load())
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitFor := func(what string, limit time.Duration, cond func() bool) time.Duration {
		t.Helper()
		start := time.Now()
		for !cond() {
			if time.Since(start) > 10*time.Second {
				t.Fatalf("%s: not within 10 s", what)
			}
			time.Sleep(time.Millisecond)
		}
		took := time.Since(start)
		t.Logf("%s after %v (bound %v)", what, took.Round(time.Millisecond), limit)
		if took > limit {
			t.Errorf("%s after %v, more than %v", what, took, limit)
		}
		return took
	}

	waitCalls(500)
	if s.Degraded() {
		t.Fatal("degraded while Redis runs")
	}
	srv.Kill()
	waitFor("degraded", time.Second, s.Degraded)
	waitCalls(500) // answered from memory
	// Stay down long enough for failed probes to trip go-redis's dial
	// circuit breaker (PoolSize failed dials; it then retries once a
	// second), as a longer outage would.
	waitFor("probes failing", 10*time.Second, func() bool { return value(t, s.Metrics().ProbeFailures) >= 6 })
	srv.Restart()
	waitFor("back on Redis", 2*time.Second, func() bool { return !s.Degraded() })
	waitCalls(500)
	close(stop)
	wg.Wait()
	if n := failures.Load(); n != 0 {
		t.Fatalf("%d of %d calls failed; first error: %v", n, calls.Load(), firstErr.Load())
	}
	if degradedCalls.Load() == 0 {
		t.Fatal("no call was answered while degraded")
	}
	t.Logf("%d calls, %d while degraded, 0 failed", calls.Load(), degradedCalls.Load())
}

// discard is a go-redis logger that drops everything.
type discard struct{}

func (discard) Printf(context.Context, string, ...any) {}

// TestOutageKeepsBudgets runs one key of each algorithm through an outage
// on a real redis-server: the key uses its limit on Redis, Redis is killed
// (its data lost), the fallback answers, Redis restarts empty and the
// Store returns to it. Across the whole cycle each key must admit its limit
// once: the memory store starts from Redis's last answers (Seed) rather
// than a full limiter, and what it held goes back to Redis (Carry) rather
// than Redis starting full again.
func TestOutageKeepsBudgets(t *testing.T) {
	redis.SetLogger(discard{})
	srv := redistest.StartServer(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true,
		DialTimeout: 200 * time.Millisecond, ReadTimeout: 100 * time.Millisecond, WriteTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { client.Close() })
	primary, err := redisstore.New(client, redisstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(primary, memory.New(memory.Options{}), Options{
		Probe:         func(ctx context.Context) error { return client.Ping(ctx).Err() },
		ProbeInterval: time.Hour, // probes are driven below
		Deadline:      250 * time.Millisecond,
		TrustContext:  true,
		Logger:        quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	const limit = 10
	var checks []store.Check
	for _, a := range []algorithms.Kind{algorithms.KindFixedWindow, algorithms.KindSlidingWindow, algorithms.KindSlidingLog, algorithms.KindTokenBucket, algorithms.KindGCRA} {
		l := store.Limit{Algorithm: a, Requests: limit, Window: 24 * time.Hour}
		if a == algorithms.KindFixedWindow {
			now, err := client.Time(t.Context()).Result()
			if err != nil {
				t.Fatal(err)
			}
			l.Window = redistest.FarWindow(t, now)
		}
		checks = append(checks, store.Check{Key: store.Key("outage", []store.Entry{{Key: "alg", Value: a.String()}}, "l#0", a), Limit: l, Cost: 1})
	}
	admitted := make([]int, len(checks))
	decide := func(n int) {
		t.Helper()
		for i, c := range checks {
			out := make([]algorithms.Result, 1)
			for range n {
				if err := s.Decide(t.Context(), []store.Check{c}, out); err != nil {
					t.Fatal(err)
				}
				if out[0].Allowed {
					admitted[i]++
				}
			}
		}
	}
	decide(limit + 2) // each key's whole limit, on Redis
	srv.Kill()
	decide(limit) // from memory: the first failures do not switch, later ones do
	if !s.Degraded() {
		t.Fatal("not degraded after 10 failures in a row")
	}
	srv.Restart()
	if !s.ProbeOnce(t.Context()) || s.Degraded() {
		t.Fatal("not back on Redis after a good probe")
	}
	decide(limit)
	for i, c := range checks {
		t.Logf("%s: %d admitted over the cycle, limit %d", c.Limit.Algorithm, admitted[i], limit)
		if admitted[i] != limit {
			t.Errorf("%s: %d admitted over the cycle, want its limit %d", c.Limit.Algorithm, admitted[i], limit)
		}
	}
	if n := value(t, s.Metrics().Carried); n != float64(len(checks)) {
		t.Errorf("%v keys carried, want %d", n, len(checks))
	}
}
