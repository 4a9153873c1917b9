package redisstore

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/store"
)

// TestReserveSlotsAcrossStores: callers on two stores (two connections, as
// two control-plane replicas) reserve on one key at the same instant. Each
// granted reservation takes its own slot: burst+1 pass at once (the last of
// them pays later, as in Guava), every other grant waits a distinct multiple
// of the interval, up to max_wait, and the rest are refused with the wait
// they would have needed.
func TestReserveSlotsAcrossStores(t *testing.T) {
	srv, c1 := startClient(t)
	c2 := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { c2.Close() })
	clk := newClock(1_700_000_000_000_000)
	stores := []*Store{newStore(t, c1, Options{Now: clk.Now}), newStore(t, c2, Options{Now: clk.Now})}
	l := store.Limit{Algorithm: algorithms.KindReserve, Requests: 10, Window: time.Second, Burst: 5, MaxWait: 2 * time.Second}
	key := store.Key("shaping", []store.Entry{{Key: "k", Value: "v"}}, "k#0", algorithms.KindReserve)
	const perStore = 30
	results := make(chan algorithms.Result, 2*perStore)
	var wg sync.WaitGroup
	for _, s := range stores {
		for range perStore {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out := make([]algorithms.Result, 1)
				if err := s.Decide(context.Background(), []store.Check{{Key: key, Limit: l, Cost: 1}}, out); err != nil {
					t.Error(err)
				}
				results <- out[0]
			}()
		}
	}
	wg.Wait()
	close(results)
	const interval = int64(100 * time.Millisecond)
	var granted, refused []int64
	for r := range results {
		if r.Allowed {
			granted = append(granted, r.Wait)
		} else {
			refused = append(refused, r.Wait)
			if r.RetryAfter != r.Wait-int64(l.MaxWait) {
				t.Errorf("refused: retry-after %v, wait %v", time.Duration(r.RetryAfter), time.Duration(r.Wait))
			}
		}
	}
	slices.Sort(granted)
	// 6 at once, then one per interval up to max_wait: 20 more.
	want := []int64{0, 0, 0, 0, 0, 0}
	for k := int64(1); k*interval <= int64(l.MaxWait); k++ {
		want = append(want, k*interval)
	}
	if !slices.Equal(granted, want) {
		t.Errorf("granted waits %v,\nwant %v", granted, want)
	}
	// Refusals take nothing: each saw the queue at its full length.
	for _, w := range refused {
		if w != int64(l.MaxWait)+interval {
			t.Errorf("refused with wait %v, want %v", time.Duration(w), time.Duration(int64(l.MaxWait)+interval))
		}
	}
	if len(granted)+len(refused) != 2*perStore {
		t.Errorf("%d answers", len(granted)+len(refused))
	}
}
