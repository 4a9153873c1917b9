package redisstore

import (
	"context"
	"fmt"
	"math/rand"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/calendar"
	"github.com/sluicehq/sluice/controlplane/store"
)

// leasable lists the algorithms Lease accepts.
var leasable = []algorithms.Kind{algorithms.KindFixedWindow, algorithms.KindSlidingWindow, algorithms.KindTokenBucket, algorithms.KindGCRA}

// leaseLimits are the limits the lease tests use (windows in microseconds
// that are whole, GCRA with an emission interval of whole microseconds).
var leaseLimits = map[algorithms.Kind]store.Limit{
	algorithms.KindFixedWindow:   {Algorithm: algorithms.KindFixedWindow, Requests: 20, Window: time.Second},
	algorithms.KindSlidingWindow: {Algorithm: algorithms.KindSlidingWindow, Requests: 20, Window: time.Second},
	algorithms.KindTokenBucket:   {Algorithm: algorithms.KindTokenBucket, Requests: 20, Window: time.Second, Burst: 10},
	algorithms.KindGCRA:          {Algorithm: algorithms.KindGCRA, Requests: 20, Window: time.Second, Burst: 6},
}

// rawState returns the value at key as text (a hash's fields and values).
func rawState(t *testing.T, c *redis.Client, key string) string {
	t.Helper()
	ctx := context.Background()
	switch typ := c.Type(ctx, key).Val(); typ {
	case "string":
		return c.Get(ctx, key).Val()
	case "hash":
		return fmt.Sprint(c.HGetAll(ctx, key).Val())
	case "none":
		return ""
	default:
		return typ
	}
}

// TestLeaseEqualsRequests: a lease of k spent at once leaves the state
// exactly as k per-request decisions do: byte for byte for the windows and
// gcra (for gcra, k decisions at the lease's end: the state is written as
// of then); then every later decision agrees on both keys (for
// token_bucket and gcra, from the lease's end on).
func TestLeaseEqualsRequests(t *testing.T) {
	_, client := startClient(t)
	clk := newClock(1_700_000_000_000_000)
	s := newStore(t, client, Options{Now: clk.Now})
	ctx := context.Background()
	for _, alg := range leasable {
		for _, k := range []int64{1, 2, 5, 8} {
			t.Run(fmt.Sprintf("%s/k=%d", alg, k), func(t *testing.T) {
				l := leaseLimits[alg]
				k := min(k, capacity(l))
				a, b := fmt.Sprintf("lease:%s:%d:a", alg, k), fmt.Sprintf("lease:%s:%d:b", alg, k)
				clk.set(1_700_000_000_000_000 + 123_456) // mid-window
				start := clk.get()
				out := make([]Lease, 1)
				if err := s.Lease(ctx, []LeaseRequest{{Key: a, Limit: l, Want: k, Longest: time.Hour}}, out); err != nil {
					t.Fatal(err)
				}
				if out[0].Granted != k {
					t.Fatalf("granted %d of %d on a fresh key", out[0].Granted, k)
				}
				if Returnable(alg) {
					clk.add(int64(out[0].Valid / time.Microsecond)) // as of the lease's end
				}
				res := make([]algorithms.Result, 1)
				var last algorithms.Result
				for range k {
					if err := s.Decide(ctx, []store.Check{{Key: b, Limit: l, Cost: 1}}, res); err != nil || !res[0].Allowed {
						t.Fatalf("per-request decision: %+v %v", res[0], err)
					}
					last = res[0]
				}
				if ga, gb := rawState(t, client, a), rawState(t, client, b); ga != gb && alg != algorithms.KindTokenBucket {
					t.Fatalf("state after a lease of %d: %q, after %d requests: %q", k, ga, k, gb)
				}
				if !Returnable(alg) && out[0].Remaining != last.Remaining {
					t.Errorf("lease remaining %d, requests' %d", out[0].Remaining, last.Remaining)
				}
				// Later decisions agree.
				if !Returnable(alg) {
					clk.set(start)
				}
				for i := range 40 {
					clk.add(int64(i%7) * 13_000)
					ra, rb := make([]algorithms.Result, 1), make([]algorithms.Result, 1)
					if err := s.Decide(ctx, []store.Check{{Key: a, Limit: l, Cost: 1}}, ra); err != nil {
						t.Fatal(err)
					}
					if err := s.Decide(ctx, []store.Check{{Key: b, Limit: l, Cost: 1}}, rb); err != nil {
						t.Fatal(err)
					}
					if ra[0] != rb[0] {
						t.Fatalf("step %d: leased key %+v, per-request key %+v", i, ra[0], rb[0])
					}
				}
			})
		}
	}
}

// TestLeaseNeverOverAdmits: one key, several replicas taking leases of
// random sizes, spending them at random times within their validity,
// returning what they did not spend (token_bucket, gcra), and per-request
// decisions in between. Every admission, at the time it really happened,
// replayed through package algorithms must be allowed: the leases never
// admit what the algorithm would refuse. What was granted and neither
// spent nor returned is the under-admission, bounded by the leases
// outstanding.
func TestLeaseNeverOverAdmits(t *testing.T) {
	_, client := startClient(t)
	clk := newClock(1_700_000_000_000_000)
	s := newStore(t, client, Options{Now: clk.Now})
	for i, alg := range leasable {
		for mix := range 3 {
			t.Run(fmt.Sprintf("%s/mix%d", alg, mix), func(t *testing.T) {
				leaseNeverOverAdmits(t, s, clk, leaseLimits[alg], "never:"+alg.String(), mix, int64(700+10*i+mix))
			})
		}
	}
}

// TestLeaseNeverOverAdmitsCalendar is TestLeaseNeverOverAdmits on calendar
// days of Berlin, from 15 s before the night its clocks go back:
// a window's lease never outlives its period.
func TestLeaseNeverOverAdmitsCalendar(t *testing.T) {
	_, client := startClient(t)
	day, err := calendar.Of("Europe/Berlin", algorithms.UnitDay)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Date(2026, 10, 25, 0, 0, 0, 0, day.Location()).Add(-15 * time.Second).UnixMicro()
	for i, alg := range []algorithms.Kind{algorithms.KindFixedWindow, algorithms.KindSlidingWindow} {
		for mix := range 3 {
			t.Run(fmt.Sprintf("%s/mix%d", alg, mix), func(t *testing.T) {
				clk := newClock(start)
				s := newStore(t, client, Options{Now: clk.Now})
				l := store.Limit{Algorithm: alg, Requests: 150, Window: 24 * time.Hour, Calendar: day}
				leaseNeverOverAdmits(t, s, clk, l, fmt.Sprintf("never-calendar:%s:%d", alg, mix), mix, int64(900+10*i+mix))
				if clk.get() < start+15_000_000 {
					t.Fatalf("the steps ended %v before midnight: they must cross it", time.Duration(start+15_000_000-clk.get())*time.Microsecond)
				}
			})
		}
	}
}

// leaseNeverOverAdmits runs TestLeaseNeverOverAdmits's steps on l at key.
func leaseNeverOverAdmits(t *testing.T, s *Store, clk *clock, l store.Limit, key string, mix int, seed int64) {
	t.Helper()
	ctx := context.Background()
	alg := l.Algorithm
	rng := rand.New(rand.NewSource(seed))
	type held struct {
		units, end int64 // end on the (injected) Redis clock
		expiry     int64
	}
	var leases []*held
	var mark int64       // the latest lease end
	var admitted []int64 // admission times
	granted, spent, returned, denied := int64(0), int64(0), int64(0), 0
	for step := 0; step < 3000; step++ {
		clk.add(rng.Int63n(20_000)) // up to 20 ms
		now := clk.get()
		r := rng.Intn(10)
		if mix > 0 && r >= 3 && r < 4+2*mix {
			r = 3 // more per-request decisions
		}
		switch {
		case r < 3: // a replica takes a lease
			out := make([]Lease, 1)
			want := 1 + rng.Int63n(8)
			longest := time.Duration(1+rng.Int63n(400)) * time.Millisecond
			if err := s.Lease(ctx, []LeaseRequest{{Key: key, Limit: l, Want: want, Longest: longest}}, out); err != nil {
				t.Fatal(err)
			}
			g := out[0]
			if g.Granted > want || g.Granted < 0 {
				t.Fatalf("granted %d of %d", g.Granted, want)
			}
			if g.Granted == 0 {
				denied++
				if g.RetryAfter <= 0 {
					t.Fatalf("a refused lease without retry-after: %+v", g)
				}
				continue
			}
			if g.Valid <= 0 || g.Valid > longest && g.Valid > time.Microsecond {
				t.Fatalf("validity %v, longest %v", g.Valid, longest)
			}
			if g.End != now+int64(g.Valid/time.Microsecond) {
				t.Fatalf("end %d, now %d + valid %v", g.End, now, g.Valid)
			}
			granted += g.Granted
			mark = max(mark, g.End)
			leases = append(leases, &held{units: g.Granted, end: g.End, expiry: now + int64(g.Valid/time.Microsecond)})
		case r < 4: // a per-request decision
			res := make([]algorithms.Result, 1)
			if err := s.Decide(ctx, []store.Check{{Key: key, Limit: l, Cost: 1}}, res); err != nil {
				t.Fatal(err)
			}
			if res[0].Allowed {
				admitted = append(admitted, now)
			}
		case r < 9: // replicas spend their leases
			for _, h := range leases {
				for h.units > 0 && now < h.expiry && rng.Intn(3) > 0 {
					h.units--
					spent++
					admitted = append(admitted, now)
				}
			}
		default: // an idle lease goes back
			if len(leases) == 0 || !Returnable(alg) {
				continue
			}
			h := leases[rng.Intn(len(leases))]
			if h.units == 0 {
				continue
			}
			n, err := s.Return(ctx, []Returned{{Key: key, Limit: l, Units: h.units, End: h.end}})
			if err != nil {
				t.Fatal(err)
			}
			if (n == 1) != (now < h.end && mark <= h.end) {
				t.Fatalf("return at %d of a lease ending %d (latest end %d): %d keys", now, h.end, mark, n)
			}
			if n == 1 {
				returned += h.units
			}
			h.units = 0
		}
		kept := leases[:0]
		for _, h := range leases {
			if h.units > 0 && now < h.expiry {
				kept = append(kept, h)
			}
		}
		leases = kept
	}
	o := newOracle(l, time.Microsecond, l.Requests)
	for n, at := range admitted {
		res, err := o.allow(at, 1)
		if err != nil {
			t.Fatal(err)
		}
		if !res.Allowed {
			t.Fatalf("admission %d at %d: the algorithm refuses it (state after %d admissions): over-admission", n, at, n)
		}
	}
	if spent < 50 || denied < 20 {
		t.Fatalf("spent %d, refused leases %d: the steps do not reach the limit", spent, denied)
	}
	t.Logf("%d admissions (%d from leases), %d granted, %d returned, %d refused leases", len(admitted), spent, granted, returned, denied)
}

// TestLeaseRefusals: sliding_log is not leased, a bad state is reported, and
// a limit at its end grants nothing and says when to retry.
func TestLeaseRefusals(t *testing.T) {
	_, client := startClient(t)
	clk := newClock(1_700_000_000_000_000)
	s := newStore(t, client, Options{Now: clk.Now})
	ctx := context.Background()
	out := make([]Lease, 1)
	err := s.Lease(ctx, []LeaseRequest{{Key: "x", Limit: store.Limit{Algorithm: algorithms.KindSlidingLog, Requests: 5, Window: time.Second}, Want: 2, Longest: time.Second}}, out)
	if err == nil || !strings.Contains(err.Error(), "cannot be leased") {
		t.Errorf("sliding_log lease: %v", err)
	}
	client.Set(ctx, "junk", "not a state", 0)
	for _, alg := range leasable {
		err := s.Lease(ctx, []LeaseRequest{{Key: "junk", Limit: leaseLimits[alg], Want: 2, Longest: time.Second}}, out)
		if err == nil || !strings.Contains(err.Error(), "did not write") {
			t.Errorf("%s on a foreign value: %v", alg, err)
		}
		l := leaseLimits[alg]
		key := "full:" + alg.String()
		if err := s.Lease(ctx, []LeaseRequest{{Key: key, Limit: l, Want: capacity(l), Longest: time.Hour}}, out); err != nil || out[0].Granted != capacity(l) {
			t.Fatalf("%s: first lease %+v %v", alg, out[0], err)
		}
		if err := s.Lease(ctx, []LeaseRequest{{Key: key, Limit: l, Want: 3, Longest: time.Hour}}, out); err != nil {
			t.Fatal(err)
		}
		if out[0].Granted != 0 || out[0].RetryAfter <= 0 || out[0].Remaining != 0 {
			t.Errorf("%s: lease on a spent limit: %+v", alg, out[0])
		}
	}
}
