package redisstore

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/calendar"
	"github.com/sluicehq/sluice/controlplane/store"
	"github.com/sluicehq/sluice/controlplane/store/memory"
)

// TestCarryDifferential checks carry.lua against package algorithms on a real
// redis-server: Redis admits some requests, one or two replicas' memory
// stores (seeded from Redis's last answer, or not) admit more while Redis
// "is away", Redis keeps its data or loses it (FLUSHALL, as a restart
// without persistence), and the replicas carry what they admitted back.
// From then on Redis must decide as one Go limiter that saw every
// admission: Redis's own unless Redis lost them and no replica was seeded
// with them, and every replica's. Every algorithm, every combination, and
// replicas whose clocks are skewed from Redis's (the first ahead by skew,
// the second behind): seeded replicas by any amount, the others by a
// little (see carry.lua's window_of).
func TestCarryDifferential(t *testing.T) {
	_, client := startClient(t)
	const t0 = int64(1_800_000_000_000_000) + 100_000 // us: 100 ms into a 1 s window
	limits := map[algorithms.Kind]store.Limit{}
	for _, a := range algs {
		limits[a] = store.Limit{Algorithm: a, Requests: 10, Window: time.Second}
	}
	limits[algorithms.KindTokenBucket] = store.Limit{Algorithm: algorithms.KindTokenBucket, Requests: 1, Window: time.Hour, Burst: 10}
	limits[algorithms.KindGCRA] = store.Limit{Algorithm: algorithms.KindGCRA, Requests: 1, Window: time.Hour, Burst: 10}
	// Like the token bucket, a reserve limiter's carry refills each
	// replica's part on its own: exact when refill is negligible.
	limits[algorithms.KindReserve] = store.Limit{Algorithm: algorithms.KindReserve, Requests: 1, Window: time.Hour, Burst: 10, MaxWait: 3 * time.Hour}
	for _, alg := range algs {
		for _, sc := range carryScenarios() {
			name := fmt.Sprintf("%s/seed=%v/flush=%v/replicas=%d/skew=%v", alg, sc.seed, sc.flush, sc.replicas, sc.skew)
			t.Run(name, func(t *testing.T) {
				carryDifferential(t, client, limits[alg], "carry:"+name, t0, sc)
			})
		}
	}
}

// TestCarryDifferentialCalendar is TestCarryDifferential on calendar days of
// Berlin: Redis's window is the day before its clocks go back, the one after
// it has 25 hours; replicas' clocks skewed by up to two hours carry into the
// day their window stands for.
func TestCarryDifferentialCalendar(t *testing.T) {
	_, client := startClient(t)
	day, err := calendar.Of("Europe/Berlin", algorithms.UnitDay)
	if err != nil {
		t.Fatal(err)
	}
	// us: 100 ms into the last second of October 24th
	t0 := time.Date(2026, 10, 25, 0, 0, 0, 0, day.Location()).Add(-900 * time.Millisecond).UnixMicro()
	for _, alg := range []algorithms.Kind{algorithms.KindFixedWindow, algorithms.KindSlidingWindow, algorithms.KindSlidingLog} {
		for _, sc := range carryScenarios() {
			name := fmt.Sprintf("%s/seed=%v/flush=%v/replicas=%d/skew=%v", alg, sc.seed, sc.flush, sc.replicas, sc.skew)
			t.Run(name, func(t *testing.T) {
				l := store.Limit{Algorithm: alg, Requests: 10, Window: 24 * time.Hour, Calendar: day}
				carryDifferential(t, client, l, "carry-calendar:"+name, t0, sc)
			})
		}
	}
}

// carryScenario is one outage of TestCarryDifferential.
type carryScenario struct {
	seed, flush bool
	replicas    int
	skew        time.Duration
}

// carryScenarios are the outages: replicas seeded or not, Redis flushed or
// not, one or two replicas, skewed by any amount when seeded and by a
// millisecond at most when not.
func carryScenarios() []carryScenario {
	var scenarios []carryScenario
	for _, skew := range []time.Duration{0, time.Millisecond, 400 * time.Millisecond, 2*time.Hour + 700*time.Millisecond} {
		for _, sc := range []carryScenario{{false, false, 1, 0}, {true, false, 1, 0}, {true, true, 1, 0}, {false, true, 1, 0},
			{false, false, 2, 0}, {true, false, 2, 0}, {true, true, 2, 0}} {
			if sc.seed || skew <= time.Millisecond {
				sc.skew = skew
				scenarios = append(scenarios, sc)
			}
		}
	}
	return scenarios
}

// carryDifferential runs one outage of sc on l at key: Redis's window (of
// at least a second) ends 900 ms after t0 (us).
func carryDifferential(t *testing.T, client *redis.Client, l store.Limit, key string, t0 int64, sc carryScenario) {
	t.Helper()
	ctx := context.Background()
	alg := l.Algorithm
	clk := newClock(t0)
	rs := newStore(t, client, Options{Now: clk.Now})
	all := newOracle(l, time.Microsecond, 100)  // every admission
	lost := newOracle(l, time.Microsecond, 100) // the replicas' only
	check := []store.Check{{Key: key, Limit: l, Cost: 1}}
	out := make([]algorithms.Result, 1)
	for i := range int64(6) { // 6 of 10: Seed keeps answers of limiters at least half used
		clk.set(t0 + i*1000)
		if err := rs.Decide(ctx, check, out); err != nil || !out[0].Allowed {
			t.Fatalf("Redis: %v %+v", err, out[0])
		}
		all.allow(clk.get(), 1)
	}
	last := out[0]
	var mems []*memory.Store
	for r := range sc.replicas {
		skew := sc.skew * time.Duration(1-2*r) // the first ahead of Redis, the second behind
		m := memory.New(memory.Options{Now: func() time.Time { return clk.Now().Add(skew) }})
		if sc.seed { // as the answer arrives, before Redis goes away
			m.Seed(check, []algorithms.Result{last})
		}
		mems = append(mems, m)
	}
	for r, m := range mems {
		for i := range int64(2) {
			clk.set(t0 + 50_000 + int64(r)*10_000 + i*1000)
			if err := m.Decide(ctx, check, out); err != nil || !out[0].Allowed {
				t.Fatalf("replica %d: %v %+v", r, err, out[0])
			}
			all.allow(clk.get(), 1)
			lost.allow(clk.get(), 1)
		}
	}
	if sc.flush {
		if err := client.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	clk.set(t0 + 100_000)
	for _, m := range mems {
		if err := m.Unload(true, func(b []store.Carry) error {
			_, err := rs.Carry(ctx, b)
			return err
		}); err != nil {
			t.Fatalf("Carry: %v", err)
		}
		if st := m.Stats(); st.Entries != 0 {
			t.Fatalf("%d entries after a draining Unload", st.Entries)
		}
	}
	want := all
	if sc.flush && !sc.seed {
		want = lost
	}
	for i := range int64(24) {
		// 12 requests in Redis's window, then 12 in the next
		// one (it starts at t0+900 ms), which must be whole
		at := t0 + 120_000 + i*1000
		if i >= 12 {
			at = t0 + 910_000 + (i-12)*1000
		}
		clk.set(at)
		if err := rs.Decide(ctx, check, out); err != nil {
			t.Fatal(err)
		}
		w, _ := want.allow(clk.get(), 1)
		// A reserve's wait: each replica's part refilled on its
		// own during the outage (as a token bucket's does), so
		// the merged limiter owes less by at most the outage
		// (100 ms) per replica.
		waitOff := (out[0].Wait - w.Wait*1000) * -1
		if out[0].Allowed != w.Allowed || out[0].Remaining != w.Remaining ||
			(alg == algorithms.KindFixedWindow && out[0].ResetAfter != w.ResetAfter*1000) ||
			waitOff < 0 || waitOff > int64(sc.replicas)*int64(100*time.Millisecond) {
			t.Fatalf("request %d after the carry: Redis allowed=%v remaining=%d reset=%v wait=%v, Go allowed=%v remaining=%d reset=%dus wait=%dus",
				i, out[0].Allowed, out[0].Remaining, time.Duration(out[0].ResetAfter), time.Duration(out[0].Wait),
				w.Allowed, w.Remaining, w.ResetAfter, w.Wait)
		}
	}
}

// TestCarryEdges checks what Carry leaves alone: a replica's window that
// stands for a window here that closed, a key holding something sluice did
// not write (named in the error, the other keys still carried), a limit the
// scripts refuse.
func TestCarryEdges(t *testing.T) {
	_, client := startClient(t)
	ctx := context.Background()
	const t0 = int64(1_800_000_000_000_000) // us, a whole second
	clk := newClock(t0 + 1_100_000)         // 1.1 s: the window [t0, t0+1s) has closed
	rs := newStore(t, client, Options{Now: clk.Now})
	fw := store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 10, Window: time.Second}
	if err := client.Set(ctx, "carry:alien", "not sluice's", 0).Err(); err != nil {
		t.Fatal(err)
	}
	n, err := rs.Carry(ctx, []store.Carry{
		// ends 100 ms from now: it stands for [t0, t0+1s), whose end is nearest
		{Key: "carry:closed", Limit: fw, Left: int64(100 * time.Millisecond), Used: 5},
		{Key: "carry:alien", Limit: fw, Left: int64(900 * time.Millisecond), Used: 5},
		{Key: "carry:bad-limit", Limit: store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 0, Window: time.Second}, Used: 5},
		{Key: "carry:open", Limit: fw, Left: int64(900 * time.Millisecond), Used: 5},
	})
	if n != 1 || err == nil || !strings.Contains(err.Error(), "2 keys skipped") {
		t.Fatalf("Carry = %d, %v; want 1 key carried and 2 skipped", n, err)
	}
	if v, _ := client.Get(ctx, "carry:alien").Result(); v != "not sluice's" {
		t.Fatalf("a foreign key was changed to %q", v)
	}
	if ex, _ := client.Exists(ctx, "carry:closed").Result(); ex != 0 {
		t.Fatal("a closed window was carried")
	}
	out := make([]algorithms.Result, 1)
	if err := rs.Decide(ctx, []store.Check{{Key: "carry:open", Limit: fw, Cost: 1}}, out); err != nil || out[0].Remaining != 4 {
		t.Fatalf("after carrying 5 of 10: %v %+v, want remaining 4", err, out[0])
	}
}
