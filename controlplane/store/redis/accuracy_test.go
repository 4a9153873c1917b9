package redisstore

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/store"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestAccuracy: three stores with separate clients, as three control-plane
// replicas, and 64 concurrent callers each hammer one key per algorithm on
// the production clock (Redis TIME). Demand is about twice the limit and no
// capacity comes back during the test (aligned windows are chosen far from
// their boundaries, refill takes an hour per request), so every algorithm must
// admit exactly the limit: none over, none under.
func TestAccuracy(t *testing.T) {
	srv, admin := startClient(t)
	const replicas, callers, limit = 3, 64, 1000
	const attempts = 2*limit/(replicas*callers) + 1 // per caller: about twice the limit in all
	var stores []*Store
	for range replicas {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: callers})
		t.Cleanup(func() { c.Close() })
		stores = append(stores, newStore(t, c, Options{}))
	}
	now, err := admin.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	aligned := redistest.FarWindow(t, now)
	limits := map[algorithms.Kind]store.Limit{
		algorithms.KindFixedWindow:   {Algorithm: algorithms.KindFixedWindow, Requests: limit, Window: aligned},
		algorithms.KindSlidingWindow: {Algorithm: algorithms.KindSlidingWindow, Requests: limit, Window: aligned},
		algorithms.KindSlidingLog:    {Algorithm: algorithms.KindSlidingLog, Requests: limit, Window: time.Hour},
		algorithms.KindTokenBucket:   {Algorithm: algorithms.KindTokenBucket, Requests: 1, Window: time.Hour, Burst: limit},
		algorithms.KindGCRA:          {Algorithm: algorithms.KindGCRA, Requests: 1, Window: time.Hour, Burst: limit},
		// burst limit-1 and the one that pays later (as in Guava); then a wait of an hour.
		algorithms.KindReserve: {Algorithm: algorithms.KindReserve, Requests: 1, Window: time.Hour, Burst: limit - 1, MaxWait: 59 * time.Minute},
	}
	for _, alg := range algs {
		t.Run(alg.String(), func(t *testing.T) {
			check := store.Check{Key: store.Key("accuracy", nil, "l", alg), Limit: limits[alg], Cost: 1}
			var admitted, denied atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, replicas*callers)
			for _, s := range stores {
				for range callers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						out := make([]algorithms.Result, 1)
						for range attempts {
							ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
							err := s.Decide(ctx, []store.Check{check}, out)
							cancel()
							if err != nil {
								errs <- err
								return
							}
							if out[0].Allowed {
								admitted.Add(1)
							} else {
								denied.Add(1)
							}
						}
					}()
				}
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			if got := admitted.Load(); got != limit {
				t.Errorf("admitted %d of %d requests, want exactly %d", got, got+denied.Load(), limit)
			}
			if admitted.Load()+denied.Load() < 2*limit {
				t.Errorf("demand %d does not exceed the limit %d enough", admitted.Load()+denied.Load(), limit)
			}
		})
	}
}

// keyName is a readable key for tests that do not need store.Key's hashing.
func keyName(prefix string, i int) string { return "sluice-test:" + prefix + ":" + strconv.Itoa(i) }
