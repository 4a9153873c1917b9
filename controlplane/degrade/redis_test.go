package degrade

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/controlplane/store"
	"github.com/sluicehq/sluice/controlplane/store/memory"
	redisstore "github.com/sluicehq/sluice/controlplane/store/redis"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/shared/algorithms"
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
				Key:   store.Key("fault", []store.Entry{{Key: "worker", Value: fmt.Sprint(w)}}, "l#0", store.FixedWindow),
				Limit: store.Limit{Algorithm: store.FixedWindow, Requests: 1 << 30, Window: time.Hour},
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
