package degrade

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/store"
	"github.com/sluicehq/sluice/controlplane/store/memory"
	redisstore "github.com/sluicehq/sluice/controlplane/store/redis"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestOnceAcrossFailover: a settlement (store.Once) is applied once on
// Redis; once Redis is gone, its retry, answered by the memory fallback,
// is a duplicate too (the fallback was told of it with the primary's
// answer), and a settlement the fallback applies is applied once there.
// When Redis returns (empty), the fallback's tokens go to it with the
// carried counts: retries of both settlements charge nothing there.
func TestOnceAcrossFailover(t *testing.T) {
	redis.SetLogger(discard{})
	srv := redistest.StartServer(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), DialerRetries: 1, PoolSize: 2})
	t.Cleanup(func() { client.Close() })
	primary, err := redisstore.New(client, redisstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	fallback := memory.New(memory.Options{})
	s, err := New(primary, fallback, Options{
		Probe:         func(ctx context.Context) error { return client.Ping(ctx).Err() },
		ProbeInterval: time.Hour, // the test probes itself
		Deadline:      5 * time.Second,
		TrustContext:  true,
		Trip:          Trip{Failures: 1}, // the first failure degrades: the way back carries
		Logger:        quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	lim := store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 100, Window: time.Hour}
	key := store.Key("settle", []store.Entry{{Key: "user", Value: "a"}}, "l#0", algorithms.KindFixedWindow)
	settle := func(token string, cost int64) (algorithms.Result, bool) {
		t.Helper()
		o := &store.Once{Token: token}
		out := make([]algorithms.Result, 1)
		if err := s.Decide(context.Background(), []store.Check{{Key: key, Limit: lim, Cost: cost, Mode: store.Charge, Once: o}}, out); err != nil {
			t.Fatal(err)
		}
		return out[0], o.Duplicate
	}
	steps := []struct {
		token     string
		cost      int64
		kill      bool
		back      bool // Redis restarts and the store returns to it
		dup       bool
		remaining int64
	}{
		{"b1/0", 60, false, false, false, 40}, // Redis applies it
		{"b1/0", 60, false, false, true, 40},  // Redis: a retry
		{"b1/0", 60, true, false, true, 40},   // Redis gone: the fallback (seeded with 60 used) knows the token
		{"b2/0", 30, false, false, false, 10}, // the fallback applies a new one...
		{"b2/0", 30, false, false, true, 10},  // ...once
		// Redis returns, empty: the carry restores 90 used, and the
		// fallback's tokens (its own and those it learnt) go with it.
		{"b2/0", 30, false, true, true, 10},
		{"b1/0", 60, false, false, true, 10},
		{"b3/0", 5, false, false, false, 5},
	}
	for i, st := range steps {
		if st.kill {
			srv.Kill()
		}
		if st.back {
			srv.Restart() // empty: Redis kept nothing
			if !s.ProbeOnce(context.Background()) || s.Degraded() {
				t.Fatalf("step %d: not back on Redis", i)
			}
		}
		r, dup := settle(st.token, st.cost)
		if dup != st.dup || r.Remaining != st.remaining {
			t.Fatalf("step %d (%s): duplicate %v, remaining %d; want %v, %d", i, st.token, dup, r.Remaining, st.dup, st.remaining)
		}
	}
}
