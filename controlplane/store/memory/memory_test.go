package memory

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/calendar"
	"github.com/sluicehq/sluice/controlplane/store"
)

// clock is a settable clock for tests.
type clock struct{ ns atomic.Int64 }

func newClock() *clock {
	c := &clock{}
	c.ns.Store(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}

func (c *clock) Now() time.Time           { return time.Unix(0, c.ns.Load()) }
func (c *clock) Advance(d time.Duration)  { c.ns.Add(int64(d)) }
func (c *clock) nanos() int64             { return c.ns.Load() }
func newStore(c *clock, o Options) *Store { o.Now = c.Now; return New(o) }

// decide runs one check and fails the test on error.
func decide(t *testing.T, s *Store, c store.Check) algorithms.Result {
	t.Helper()
	out := make([]algorithms.Result, 1)
	if err := s.Decide(context.Background(), []store.Check{c}, out); err != nil {
		t.Fatalf("Decide(%+v): %v", c, err)
	}
	return out[0]
}

var limits = []store.Limit{
	{Algorithm: algorithms.KindFixedWindow, Requests: 5, Window: time.Second},
	{Algorithm: algorithms.KindSlidingWindow, Requests: 7, Window: 2 * time.Second},
	{Algorithm: algorithms.KindSlidingLog, Requests: 6, Window: time.Second},
	{Algorithm: algorithms.KindTokenBucket, Requests: 3, Window: time.Second, Burst: 8},
	{Algorithm: algorithms.KindGCRA, Requests: 4, Window: time.Second, Burst: 5},
	{Algorithm: algorithms.KindTokenBucket, Requests: 3, Window: time.Second}, // Burst 0 = Requests
	{Algorithm: algorithms.KindReserve, Requests: 10, Window: time.Second, Burst: 5, MaxWait: 500 * time.Millisecond},
	{Algorithm: algorithms.KindReserve, Requests: 3, Window: time.Second, MaxWait: 0},
}

// oracle decides like the memory store should, straight through
// package algorithms with state kept by the test.
type oracle struct {
	fw  algorithms.FixedWindowState
	sw  algorithms.SlidingWindowState
	log *algorithms.SlidingLogState
	tb  algorithms.TokenBucketState
	gc  algorithms.GCRAState
	rs  algorithms.ReserveState
}

func (o *oracle) allow(l store.Limit, now, cost int64) (algorithms.Result, error) {
	return o.decide(l, now, cost, store.Take)
}

// decide decides one check of mode at now, with the calendar's periods
// around now for a calendar limit.
func (o *oracle) decide(l store.Limit, now, cost int64, mode store.Mode) (algorithms.Result, error) {
	w := int64(l.Window)
	b := l.Burst
	if b == 0 {
		b = l.Requests
	}
	p := l.Periods(now)
	switch l.Algorithm {
	case algorithms.KindFixedWindow:
		return checkOn(algorithms.FixedWindow{Limit: l.Requests, Window: w, Aligned: true, Periods: p}, &o.fw, mode, now, cost)
	case algorithms.KindSlidingWindow:
		return checkOn(algorithms.SlidingWindow{Limit: l.Requests, Window: w, Periods: p}, &o.sw, mode, now, cost)
	case algorithms.KindSlidingLog:
		a := algorithms.SlidingLog{Limit: l.Requests, Window: w, Periods: p}
		if o.log == nil {
			o.log = a.NewState()
		}
		return checkOn(a, o.log, mode, now, cost)
	case algorithms.KindTokenBucket:
		return checkOn(algorithms.TokenBucket{Rate: l.Requests, Period: w, Burst: b}, &o.tb, mode, now, cost)
	case algorithms.KindGCRA:
		return checkOn(algorithms.GCRA{MaxBurst: b - 1, Count: l.Requests, Period: w}, &o.gc, mode, now, cost)
	case algorithms.KindReserve:
		return checkOn(algorithms.Reserve{Rate: l.Requests, Period: w, Burst: b, MaxWait: int64(l.MaxWait)}, &o.rs, mode, now, cost)
	}
	return algorithms.Result{}, errors.New("unknown algorithm")
}

// calendarLimits count calendar periods in two zones, across daylight-saving
// changes and months' ends (see calendarClock).
var calendarLimits = func() []store.Limit {
	var ls []store.Limit
	for _, c := range []struct {
		zone string
		unit algorithms.Unit
		alg  algorithms.Kind
		n    int64
	}{
		{"Europe/Berlin", algorithms.UnitDay, algorithms.KindFixedWindow, 5},
		{"America/New_York", algorithms.UnitMonth, algorithms.KindFixedWindow, 40},
		{"Europe/Berlin", algorithms.UnitWeek, algorithms.KindSlidingWindow, 12},
		{"America/New_York", algorithms.UnitDay, algorithms.KindSlidingWindow, 7},
		{"Europe/Berlin", algorithms.UnitMonth, algorithms.KindSlidingLog, 30},
		{"America/New_York", algorithms.UnitDay, algorithms.KindSlidingLog, 6},
	} {
		cal, err := calendar.Of(c.zone, c.unit)
		if err != nil {
			panic(err)
		}
		ls = append(ls, store.Limit{Algorithm: c.alg, Requests: c.n, Window: cal.Longest().Truncate(time.Hour), Calendar: cal})
	}
	return ls
}()

// calendarClock starts a week before Berlin's clocks go back (October 25th,
// 2026), with New York's a week later and October's end between them.
func calendarClock() *clock {
	c := &clock{}
	c.ns.Store(time.Date(2026, 10, 18, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}

// TestMatchesAlgorithms drives every algorithm through the store and through
// package algorithms directly with the same random times, costs and modes
// (probes, charges and refunds among them); the results must be identical,
// also across expiry, sweeps and peeks, and for calendar limits across
// daylight-saving changes and a month's end.
func TestMatchesAlgorithms(t *testing.T) {
	for _, l := range append(append([]store.Limit{}, limits...), calendarLimits...) {
		name := fmt.Sprintf("%s/%d/%d", l.Algorithm, l.Requests, l.Burst)
		if l.Calendar != nil {
			name = fmt.Sprintf("%s/%d/%v", l.Algorithm, l.Requests, l.Calendar)
		}
		t.Run(name, func(t *testing.T) {
			c := newClock()
			window := l.Window
			if l.Calendar != nil {
				c, window = calendarClock(), l.Calendar.Shortest()/4 // steps of hours to days: most decisions near another
			}
			s := newStore(c, Options{})
			rng := rand.New(rand.NewPCG(1, uint64(l.Algorithm)))
			var o oracle
			capacity := l.Requests
			if l.Burst > 0 {
				capacity = l.Burst
			}
			for step := 0; step < 5000; step++ {
				switch rng.IntN(10) {
				case 0:
					c.Advance(time.Duration(rng.Int64N(int64(3 * window))))
				case 1, 2, 3:
					c.Advance(time.Duration(rng.Int64N(int64(window / 10))))
				}
				if rng.IntN(50) == 0 {
					s.Sweep()
				}
				mode, cost := store.Take, rng.Int64N(capacity+1)
				switch rng.IntN(10) {
				case 0:
					mode, cost = store.Probe, 0
				case 1:
					mode, cost = store.Charge, rng.Int64N(3*capacity+1)
				case 2, 3:
					mode, cost = store.Refund, rng.Int64N(capacity+1)
				}
				want, err := o.decide(l, c.nanos(), cost, mode)
				if err != nil {
					t.Fatal(err)
				}
				got := decide(t, s, store.Check{Key: "k", Limit: l, Cost: cost, Mode: mode})
				if got != want {
					t.Fatalf("step %d %v cost %d at %v: store %+v, algorithms %+v", step, mode, cost, c.Now(), got, want)
				}
			}
		})
	}
}

// TestProbeOfUnusedKey: a probe (hits_addend 0) of a key that nothing
// counted yet answers, for a fixed window, the time until the window ends,
// as envoyproxy/ratelimit does, and leaves nothing stored; the other
// algorithms are full now and say so (0), a calendar month until its end.
func TestProbeOfUnusedKey(t *testing.T) {
	c := newClock()
	c.Advance(9 * time.Minute) // 51 minutes before the hour ends
	s := newStore(c, Options{})
	for _, l := range limits {
		l.Window = time.Hour
		for _, mode := range []store.Mode{store.Take, store.Probe} {
			r := decide(t, s, store.Check{Key: "unused", Limit: l, Mode: mode})
			want := int64(0)
			if l.Algorithm == algorithms.KindFixedWindow {
				want = int64(51 * time.Minute)
			}
			if r.ResetAfter != want || r.Remaining != r.Limit || !r.Allowed {
				t.Errorf("%s %v of an unused key: %+v, want reset after %v", l.Algorithm, mode, r, time.Duration(want))
			}
		}
	}
	cal, _ := calendar.Of("Europe/Berlin", algorithms.UnitMonth)
	l := store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 10, Window: 31 * 24 * time.Hour, Calendar: cal}
	r := decide(t, s, store.Check{Key: "unused", Limit: l, Mode: store.Probe})
	end := time.Date(2026, 12, 1, 0, 0, 0, 0, cal.Location())
	if want := end.Sub(c.Now()); time.Duration(r.ResetAfter) != want {
		t.Errorf("calendar month probe: reset after %v, want %v (December 1st in Berlin)", time.Duration(r.ResetAfter), want)
	}
	if n := s.Stats().Entries; n != 0 {
		t.Errorf("probes stored %d entries", n)
	}
}

func TestFullStateNotStoredAndExpiry(t *testing.T) {
	c := newClock()
	s := newStore(c, Options{})
	l := store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 3, Window: time.Minute}
	// A peek on a missing key stores nothing.
	if r := decide(t, s, store.Check{Key: "a", Limit: l}); !r.Allowed || r.Remaining != 3 {
		t.Fatalf("peek: %+v", r)
	}
	if n := s.Stats().Entries; n != 0 {
		t.Fatalf("peek stored %d entries", n)
	}
	// Align the clock to a window start so the reset time is known.
	c.ns.Store(c.nanos() - c.nanos()%int64(time.Minute))
	r := decide(t, s, store.Check{Key: "a", Limit: l, Cost: 1})
	if r.ResetAfter != int64(time.Minute) || s.Stats().Entries != 1 {
		t.Fatalf("after a hit: %+v, %d entries", r, s.Stats().Entries)
	}
	c.Advance(time.Minute - 1)
	if n := s.Sweep(); n != 0 {
		t.Fatalf("swept %d entries before their reset", n)
	}
	c.Advance(1)
	if n := s.Sweep(); n != 1 {
		t.Fatalf("swept %d entries at their reset, want 1", n)
	}
	if st := s.Stats(); st.Entries != 0 || st.Bytes != 0 || st.Expired != 1 {
		t.Fatalf("after sweep: %+v", st)
	}
	// A token bucket refilled to full by an allowed zero-cost peek is
	// dropped at once.
	tb := store.Limit{Algorithm: algorithms.KindTokenBucket, Requests: 10, Window: time.Second}
	decide(t, s, store.Check{Key: "b", Limit: tb, Cost: 10})
	if s.Stats().Entries != 1 {
		t.Fatal("token bucket entry not stored")
	}
	c.Advance(time.Second)
	if r := decide(t, s, store.Check{Key: "b", Limit: tb}); r.Remaining != 10 || r.ResetAfter != 0 {
		t.Fatalf("refilled bucket: %+v", r)
	}
	if s.Stats().Entries != 0 {
		t.Fatal("full bucket still stored")
	}
}

func TestLimitChanges(t *testing.T) {
	c := newClock()
	s := newStore(c, Options{})
	small := store.Limit{Algorithm: algorithms.KindSlidingLog, Requests: 4, Window: time.Minute}
	big := small
	big.Requests = 8
	for i := 0; i < 4; i++ {
		decide(t, s, store.Check{Key: "k", Limit: big, Cost: 1})
	}
	// Lowered to 4: the log sized for 8 serves it and keeps its 4 entries.
	if r := decide(t, s, store.Check{Key: "k", Limit: small, Cost: 1}); r.Allowed {
		t.Fatalf("lowered limit forgot the log: %+v", r)
	}
	// Raised to 16: the log is too small and starts over.
	bigger := small
	bigger.Requests = 16
	if r := decide(t, s, store.Check{Key: "k", Limit: bigger, Cost: 1}); !r.Allowed || r.Remaining != 15 {
		t.Fatalf("raised limit: %+v", r)
	}
	if st := s.Stats(); st.Entries != 1 || st.Bytes != entrySize("k", 16) {
		t.Fatalf("after recreate: %+v", st)
	}
	// Another algorithm on the same key starts from a fresh state too.
	fw := store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 2, Window: time.Minute}
	if r := decide(t, s, store.Check{Key: "k", Limit: fw, Cost: 2}); !r.Allowed || r.Remaining != 0 {
		t.Fatalf("algorithm change: %+v", r)
	}
	if st := s.Stats(); st.Entries != 1 || st.Bytes != entrySize("k", 0) {
		t.Fatalf("after algorithm change: %+v", st)
	}
}

func TestInvalidChecks(t *testing.T) {
	c := newClock()
	s := newStore(c, Options{})
	ok := store.Check{Key: "ok", Limit: store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 1, Window: time.Second}, Cost: 1}
	cases := []struct {
		name  string
		check store.Check
		want  string
	}{
		{"unknown algorithm", store.Check{Key: "x", Limit: store.Limit{Requests: 1, Window: time.Second}, Cost: 1}, "algorithm 0 is unknown"},
		{"zero requests", store.Check{Key: "x", Limit: store.Limit{Algorithm: algorithms.KindFixedWindow, Window: time.Second}, Cost: 1}, "limit must be at least 1"},
		{"negative window", store.Check{Key: "x", Limit: store.Limit{Algorithm: algorithms.KindSlidingWindow, Requests: 1, Window: -1}, Cost: 1}, "window must be positive"},
		{"negative cost", store.Check{Key: "x", Limit: store.Limit{Algorithm: algorithms.KindGCRA, Requests: 1, Window: time.Second}, Cost: -1}, "cost must not be negative"},
		{"cost over burst", store.Check{Key: "x", Limit: store.Limit{Algorithm: algorithms.KindTokenBucket, Requests: 1, Window: time.Second, Burst: 3}, Cost: 4}, "cost exceeds"},
		{"negative burst", store.Check{Key: "x", Limit: store.Limit{Algorithm: algorithms.KindTokenBucket, Requests: 1, Window: time.Second, Burst: -3}, Cost: 1}, "burst must be at least 1"},
		{"huge log", store.Check{Key: "x", Limit: store.Limit{Algorithm: algorithms.KindSlidingLog, Requests: 1 << 40, Window: time.Second}, Cost: 1}, "more than the memory store keeps"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := make([]algorithms.Result, 2)
			err := s.Decide(context.Background(), []store.Check{ok, tc.check}, out)
			if !errors.Is(err, store.ErrInvalidLimit) || !strings.Contains(err.Error(), "checks[1]") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v: want ErrInvalidLimit naming checks[1] and %q", err, tc.want)
			}
			if n := s.Stats().Entries; n != 0 {
				t.Fatalf("an invalid request changed state: %d entries", n)
			}
		})
	}
	if err := s.Decide(context.Background(), []store.Check{ok}, nil); err == nil {
		t.Fatal("no error for a short out slice")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Decide(ctx, []store.Check{ok}, make([]algorithms.Result, 1)); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled context: %v", err)
	}
}

func TestEvictionLRU(t *testing.T) {
	c := newClock()
	// 64 entries: one per shard.
	s := newStore(c, Options{MaxEntries: shardCount})
	l := store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 2, Window: time.Hour}
	// Find two keys of one shard.
	first := "key-0"
	second := ""
	for i := 1; second == ""; i++ {
		k := fmt.Sprintf("key-%d", i)
		if s.shardOf(k) == s.shardOf(first) {
			second = k
		}
	}
	decide(t, s, store.Check{Key: first, Limit: l, Cost: 2})
	if r := decide(t, s, store.Check{Key: first, Limit: l, Cost: 1}); r.Allowed {
		t.Fatal("limit not enforced")
	}
	decide(t, s, store.Check{Key: second, Limit: l, Cost: 1}) // evicts first
	if st := s.Stats(); st.Entries != 1 || st.Evicted != 1 {
		t.Fatalf("after eviction: %+v", st)
	}
	if r := decide(t, s, store.Check{Key: first, Limit: l, Cost: 1}); !r.Allowed || r.Remaining != 1 {
		t.Fatalf("evicted key should start full: %+v", r)
	}
}

func TestEvictionKeepsRecentlyUsed(t *testing.T) {
	c := newClock()
	s := newStore(c, Options{MaxEntries: 3 * shardCount})
	l := store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 10, Window: time.Hour}
	sh := s.shardOf("hot")
	var same []string
	for i := 0; len(same) < 4; i++ {
		if k := fmt.Sprintf("cold-%d", i); s.shardOf(k) == sh {
			same = append(same, k)
		}
	}
	decide(t, s, store.Check{Key: "hot", Limit: l, Cost: 5})
	decide(t, s, store.Check{Key: same[0], Limit: l, Cost: 1})
	decide(t, s, store.Check{Key: same[1], Limit: l, Cost: 1})
	decide(t, s, store.Check{Key: "hot", Limit: l, Cost: 1}) // hot is now the most recent
	decide(t, s, store.Check{Key: same[2], Limit: l, Cost: 1})
	decide(t, s, store.Check{Key: same[3], Limit: l, Cost: 1}) // evicts same[0] then same[1]
	if r := decide(t, s, store.Check{Key: "hot", Limit: l}); r.Remaining != 4 {
		t.Fatalf("the recently used key was evicted: %+v", r)
	}
	if st := s.Stats(); st.Evicted != 2 || st.Entries != 3 {
		t.Fatalf("stats %+v, want 2 evicted and 3 held", st)
	}
}

func TestHostileKeysBounded(t *testing.T) {
	c := newClock()
	const maxEntries, maxBytes = 1000, 1 << 20
	s := newStore(c, Options{MaxEntries: maxEntries, MaxBytes: maxBytes})
	fw := store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 10, Window: time.Hour}
	log := store.Limit{Algorithm: algorithms.KindSlidingLog, Requests: 1000, Window: time.Hour}
	checks := make([]store.Check, 2)
	out := make([]algorithms.Result, 2)
	for i := 0; i < 50000; i++ {
		k := fmt.Sprintf("hostile\x00{%d}:\n", i)
		checks[0] = store.Check{Key: k, Limit: fw, Cost: 1}
		checks[1] = store.Check{Key: k + "log", Limit: log, Cost: 1}
		if err := s.Decide(context.Background(), checks, out); err != nil {
			t.Fatal(err)
		}
		if !out[0].Allowed || !out[1].Allowed {
			t.Fatalf("fresh key %d denied: %+v", i, out)
		}
	}
	st := s.Stats()
	if st.Entries > maxEntries || st.Bytes > maxBytes {
		t.Fatalf("bounds exceeded: %+v", st)
	}
	if st.Evicted < 50000*2-maxEntries {
		t.Fatalf("evicted %d, want at least %d", st.Evicted, 50000*2-maxEntries)
	}
}

func TestOversizedEntryKeptAlone(t *testing.T) {
	c := newClock()
	s := newStore(c, Options{MaxBytes: shardCount * 1024}) // 1 KB per shard
	l := store.Limit{Algorithm: algorithms.KindSlidingLog, Requests: 1000, Window: time.Hour}
	for i := 0; i < 3; i++ {
		if r := decide(t, s, store.Check{Key: "big", Limit: l, Cost: 1}); !r.Allowed || r.Remaining != int64(999-i) {
			t.Fatalf("hit %d: %+v", i, r)
		}
	}
}

// TestConcurrentExact hammers a few keys from many goroutines with the clock
// stopped: every exact algorithm admits exactly its capacity. Run with -race.
func TestConcurrentExact(t *testing.T) {
	c := newClock()
	s := newStore(c, Options{})
	lims := []store.Limit{
		{Algorithm: algorithms.KindFixedWindow, Requests: 1000, Window: time.Hour},
		{Algorithm: algorithms.KindSlidingLog, Requests: 1000, Window: time.Hour},
		{Algorithm: algorithms.KindSlidingWindow, Requests: 1000, Window: time.Hour},
		{Algorithm: algorithms.KindTokenBucket, Requests: 1, Window: time.Hour, Burst: 1000},
		{Algorithm: algorithms.KindGCRA, Requests: 1, Window: time.Hour, Burst: 1000},
	}
	const workers, perWorker = 16, 200
	allowed := make([]atomic.Int64, len(lims))
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			checks := make([]store.Check, len(lims))
			out := make([]algorithms.Result, len(lims))
			for i := range lims {
				checks[i] = store.Check{Key: fmt.Sprintf("shared-%d", i), Limit: lims[i], Cost: 1}
			}
			for n := 0; n < perWorker; n++ {
				if err := s.Decide(context.Background(), checks, out); err != nil {
					t.Error(err)
					return
				}
				for i, r := range out {
					if r.Allowed {
						allowed[i].Add(1)
					}
				}
			}
		}()
	}
	// Sweep concurrently too: nothing has expired, so nothing may go.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 50; i++ {
			if n := s.Sweep(); n != 0 {
				t.Errorf("swept %d live entries", n)
			}
			s.Stats()
		}
	}()
	wg.Wait()
	<-done
	for i, l := range lims {
		if got := allowed[i].Load(); got != 1000 {
			t.Errorf("%s admitted %d of %d, want exactly 1000", l.Algorithm, got, workers*perWorker)
		}
	}
}

func TestRunSweeper(t *testing.T) {
	c := newClock()
	s := newStore(c, Options{})
	decide(t, s, store.Check{Key: "k", Limit: store.Limit{Algorithm: algorithms.KindGCRA, Requests: 1, Window: time.Second}, Cost: 1})
	c.Advance(time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { s.RunSweeper(ctx, time.Millisecond); close(stopped) }()
	deadline := time.Now().Add(5 * time.Second)
	for s.Stats().Entries != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the sweeper did not drop the expired entry within 5 s")
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-stopped
}

func BenchmarkDecide(b *testing.B) {
	s := New(Options{})
	l := store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 1 << 30, Window: time.Hour}
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = store.Key("bench", []store.Entry{{Key: "k", Value: fmt.Sprint(i)}}, "l#0", algorithms.KindFixedWindow)
	}
	b.RunParallel(func(pb *testing.PB) {
		checks := []store.Check{{Limit: l, Cost: 1}}
		out := make([]algorithms.Result, 1)
		i := 0
		for pb.Next() {
			checks[0].Key = keys[i%len(keys)]
			i++
			if err := s.Decide(context.Background(), checks, out); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestReserveSlots checks that concurrent reservations on one key take
// distinct slots: every granted wait is a different multiple of the
// interval, and those beyond max_wait are refused and take nothing.
func TestReserveSlots(t *testing.T) {
	c := newClock()
	s := newStore(c, Options{})
	l := store.Limit{Algorithm: algorithms.KindReserve, Requests: 10, Window: time.Second, Burst: 5, MaxWait: time.Second}
	const callers = 40
	waits := make(chan algorithms.Result, callers)
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := make([]algorithms.Result, 1)
			if err := s.Decide(context.Background(), []store.Check{{Key: "k", Limit: l, Cost: 1}}, out); err != nil {
				t.Error(err)
			}
			waits <- out[0]
		}()
	}
	wg.Wait()
	close(waits)
	seen := map[int64]bool{}
	granted, zero := 0, 0
	for r := range waits {
		switch {
		case !r.Allowed:
			if r.Wait <= int64(l.MaxWait) {
				t.Errorf("refused a wait within max_wait: %+v", r)
			}
		case r.Wait == 0:
			zero++
			granted++
		default:
			granted++
			if seen[r.Wait] || r.Wait%int64(100*time.Millisecond) != 0 {
				t.Errorf("wait %v shared or off the 100 ms grid", time.Duration(r.Wait))
			}
			seen[r.Wait] = true
		}
	}
	// burst 5 + the one that pays later pass at once; then one per 100 ms up to 1 s.
	if zero != 6 || granted != 16 {
		t.Errorf("%d passed at once, %d granted; want 6 and 16", zero, granted)
	}
}
