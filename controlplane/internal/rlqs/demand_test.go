package rlqs

import (
	"context"
	"math"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
)

// testDemand runs the Demand contract on d.
func testDemand(t *testing.T, d Demand) {
	ctx := context.Background()
	now := time.Unix(1_800_000_000, 0)
	ttl := 15 * time.Second
	var seen map[string]Envoy
	assign := func(key, envoy string, demand float64, at time.Time, give float64) float64 {
		t.Helper()
		got, err := d.Assign(ctx, key, envoy, demand, at, ttl, func(all map[string]Envoy) float64 {
			seen = map[string]Envoy{}
			for id, e := range all {
				seen[id] = e
			}
			return give
		})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := assign("k", "a", 20, now, 30); got != 30 || len(seen) != 1 || seen["a"] != (Envoy{20, 0}) {
		t.Fatalf("first Envoy: assigned %v, decided on %v", got, seen)
	}
	assign("k", "b", math.Inf(1), now.Add(time.Second), 40)
	if len(seen) != 2 || seen["a"] != (Envoy{20, 30}) || !math.IsInf(seen["b"].Demand, 1) || seen["b"].Assigned != 0 {
		t.Fatalf("second Envoy decided on %v, want a {20 30} and b unknown", seen)
	}
	assign("other", "a", 5, now, 1)
	if len(seen) != 1 {
		t.Fatalf("another key decided on %v, want only its own Envoy", seen)
	}
	assign("k", "a", 25, now.Add(2*time.Second), 35)
	if seen["a"] != (Envoy{25, 30}) || seen["b"].Assigned != 40 {
		t.Fatalf("a again decided on %v, want its new demand and its previous assignment", seen)
	}
	// b's entry (written at now+1s) expires at now+1s+ttl; a's lives on.
	assign("k", "c", 7, now.Add(time.Second+ttl), 1)
	if len(seen) != 2 || seen["a"] != (Envoy{25, 35}) || seen["c"] != (Envoy{7, 0}) {
		t.Fatalf("after b's TTL: decided on %v, want a and c", seen)
	}
	// Released until later: kept until then, not past its own expiry.
	at := now.Add(time.Second + ttl)
	assign("k", "a", 25, at, 35)
	if err := d.Release(ctx, []string{"k", "missing"}, "a", at.Add(3*time.Second)); err != nil {
		t.Fatal(err)
	}
	assign("k", "c", 8, at.Add(2*time.Second), 2)
	if len(seen) != 2 || seen["a"] != (Envoy{25, 35}) {
		t.Fatalf("a released in 3 s, after 2 s: decided on %v, want a still there", seen)
	}
	assign("k", "c", 8, at.Add(3*time.Second), 2)
	if len(seen) != 1 {
		t.Fatalf("a released in 3 s, after 3 s: decided on %v, want only c", seen)
	}
	// Released at once.
	assign("k", "a", 25, at.Add(4*time.Second), 35)
	if err := d.Release(ctx, []string{"k", "other"}, "a", time.Time{}); err != nil {
		t.Fatal(err)
	}
	assign("k", "c", 8, at.Add(4*time.Second), 2)
	if len(seen) != 1 || seen["c"] != (Envoy{8, 2}) {
		t.Fatalf("after a is released: decided on %v, want only c", seen)
	}
}

func TestMemoryDemand(t *testing.T) { testDemand(t, NewMemoryDemand()) }

// TestMemoryDemandSweeps: buckets nobody reports any more are dropped.
func TestMemoryDemandSweeps(t *testing.T) {
	m := NewMemoryDemand()
	now := time.Unix(1_800_000_000, 0)
	give := func(map[string]Envoy) float64 { return 1 }
	for i := range 100 {
		m.Assign(context.Background(), "k"+strconv.Itoa(i), "a", 1, now, 15*time.Second, give)
	}
	m.Assign(context.Background(), "last", "a", 1, now.Add(16*time.Second), 15*time.Second, give)
	if n := m.Len(); n != 1 {
		t.Errorf("%d buckets held after their entries expired, want 1", n)
	}
}

func TestRedisDemand(t *testing.T) {
	srv := redistest.StartServer(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer c.Close()
	testDemand(t, NewRedisDemand(c))
	// The hash of a bucket expires with its entries.
	if ttl := c.PTTL(context.Background(), "k").Val(); ttl <= 0 || ttl > 30*time.Second {
		t.Errorf("the bucket's hash has TTL %v, want at most 2 assignment TTLs", ttl)
	}
	// Garbage in a field is skipped, not trusted.
	c.HSet(context.Background(), "k", "junk", "not an entry", "inf", "1 +Inf 99999999999999")
	var n int
	NewRedisDemand(c).Assign(context.Background(), "k", "c", 1, time.Unix(1_800_000_017, 0), 15*time.Second,
		func(all map[string]Envoy) float64 { n = len(all); return 0 })
	if n != 1 {
		t.Errorf("with malformed fields: decided on %d Envoys, want only c", n)
	}
}

// TestRedisDemandRace: replicas assigning one bucket at once never hand
// out more than the rate in all: each decides on the others' assignments
// as written, or decides again.
func TestRedisDemandRace(t *testing.T) {
	srv := redistest.StartServer(t)
	const replicas, envoys, rate, rounds = 4, 8, 100.0, 20
	now := time.Unix(1_800_000_000, 0)
	var ds []*RedisDemand
	for range replicas {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
		defer c.Close()
		ds = append(ds, NewRedisDemand(c))
	}
	for round := range rounds {
		key := "race" + strconv.Itoa(round)
		var wg sync.WaitGroup
		var mu sync.Mutex
		total := 0.0
		for e := range envoys {
			wg.Add(1)
			go func() {
				defer wg.Done()
				id := strconv.Itoa(e)
				// Each Envoy takes all that the others leave free.
				got, err := ds[e%replicas].Assign(context.Background(), key, id, math.Inf(1), now, 15*time.Second, func(all map[string]Envoy) float64 {
					share, _ := Grant(rate, all, id, 0, 0, 0) // nothing lent
					return share
				})
				if err != nil {
					t.Error(err)
				}
				mu.Lock()
				total += got
				mu.Unlock()
			}()
		}
		wg.Wait()
		if total > rate+1e-9 {
			t.Fatalf("round %d: %d Envoys on %d replicas were assigned %v in all, more than the rate %v", round, envoys, replicas, total, rate)
		}
	}
}
