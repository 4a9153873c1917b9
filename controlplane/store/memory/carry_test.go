package memory

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/calendar"
	"github.com/sluicehq/sluice/controlplane/store"
)

// TestSeedNeverAdmitsMore seeds the store from a primary's answer (the
// primary here is package algorithms with its own state) and then sends the
// same requests to both: the seeded store must never admit more than the
// primary over the next window, and for fixed_window and gcra, whose seeds
// are exact, must decide exactly as it does.
func TestSeedNeverAdmitsMore(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, l := range limits {
		seededRounds := 0
		for round := range 200 {
			c := newClock()
			c.Advance(time.Duration(rng.Int64N(int64(time.Second))))
			s := newStore(c, Options{})
			primary := &oracle{}
			check := store.Check{Key: "k", Limit: l, Cost: 1}
			var last algorithms.Result
			for range rng.IntN(12) + 1 {
				c.Advance(time.Duration(rng.Int64N(int64(50 * time.Millisecond))))
				last, _ = primary.allow(l, c.nanos(), 1)
			}
			s.Seed([]store.Check{check}, []algorithms.Result{last})
			seeded := s.Stats().Entries == 1
			if seeded != (last.Remaining*2 <= last.Limit && last.ResetAfter > 0) {
				t.Fatalf("%v round %d: answer %+v seeded %v", l, round, last, seeded)
			}
			if !seeded {
				continue // a fresh start: at most the half limit the answer had left more
			}
			seededRounds++
			var mine, theirs int
			for range 20 {
				c.Advance(time.Duration(rng.Int64N(int64(l.Window / 20))))
				want, _ := primary.allow(l, c.nanos(), 1)
				got := decide(t, s, check)
				if got.Allowed {
					mine++
				}
				if want.Allowed {
					theirs++
				}
				exact := l.Algorithm == algorithms.KindFixedWindow || l.Algorithm == algorithms.KindGCRA
				if exact && (got.Allowed != want.Allowed || got.Remaining != want.Remaining) {
					t.Fatalf("%v round %d: seeded from %+v, answered %+v, primary %+v", l, round, last, got, want)
				}
			}
			if mine > theirs {
				t.Fatalf("%v round %d: seeded from %+v, admitted %d where the primary admitted %d", l, round, last, mine, theirs)
			}
		}
		if seededRounds < 50 {
			t.Fatalf("%v: only %d of 200 rounds seeded", l, seededRounds)
		}
	}
}

// TestUnload checks what Unload reports: a seed's base and what came after
// it, then (once carried) only what came after that, nothing again after a
// draining Unload; and the same again when the carry failed.
func TestUnload(t *testing.T) {
	c := newClock()
	s := newStore(c, Options{})
	l := store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 10, Window: time.Hour}
	check := store.Check{Key: "k", Limit: l, Cost: 1}
	seedFrom := algorithms.Result{Allowed: true, Limit: 10, Remaining: 4, ResetAfter: int64(30 * time.Minute)}
	s.Seed([]store.Check{check}, []algorithms.Result{seedFrom})
	decide(t, s, check)
	decide(t, s, check)
	unload := func(drain bool, fail bool) []store.Carry {
		var got []store.Carry
		err := s.Unload(drain, func(cs []store.Carry) error {
			got = append(got, cs...)
			if fail {
				return errors.New("refused")
			}
			return nil
		})
		if (err != nil) != fail {
			t.Fatalf("Unload: %v", err)
		}
		return got
	}
	left := int64(30 * time.Minute) // the clock stands still: the seeded window ends as the answer said
	for _, step := range []struct {
		drain, fail bool
		want        []store.Carry
	}{
		{false, true, []store.Carry{{Key: "k", Limit: l, Left: left, Base: 6, Used: 8}}},
		{false, false, []store.Carry{{Key: "k", Limit: l, Left: left, Base: 6, Used: 8}}},
		{false, false, nil}, // nothing new
		{true, false, []store.Carry{{Key: "k", Limit: l, Left: left, Base: 0, Used: 1}}}, // after one more
		{true, false, nil},
	} {
		if step.drain && step.want != nil {
			decide(t, s, check)
		}
		got := unload(step.drain, step.fail)
		if len(got) != len(step.want) || (len(got) == 1 && got[0] != step.want[0]) {
			t.Fatalf("Unload(drain=%v) = %+v, want %+v", step.drain, got, step.want)
		}
	}
	if n := s.Stats().Entries; n != 0 {
		t.Fatalf("%d entries after a draining Unload", n)
	}
}

// TestSeedAcrossSkew is a failover on synthetic time: a 10 per 10 s key has
// 6 of its limit used on the primary, whose clock is skewed from this
// store's (the primary's answers carry durations, never the primary's
// instants), and the store takes over. Whatever the skew, the store must go
// on as the primary would have: the rest of the limit admitted in the
// primary's window, the reset within it, the windows after it whole. Fixed
// windows, sliding windows and GCRA are seeded exactly here (the primary's
// sliding window counted nothing before), so they must decide as the
// primary does, call for call; the others never admit more, and at most one
// call fewer over three windows. A sliding window seeded in the next window
// (from a peek: all its estimate from the previous window) is exact too.
func TestSeedAcrossSkew(t *testing.T) {
	const w = 10 * time.Second
	algs := []algorithms.Kind{algorithms.KindFixedWindow, algorithms.KindSlidingWindow, algorithms.KindSlidingLog, algorithms.KindTokenBucket, algorithms.KindGCRA, algorithms.KindReserve}
	skews := []time.Duration{0, time.Nanosecond, -time.Nanosecond, time.Millisecond, -time.Millisecond,
		3 * time.Second, -3 * time.Second, 7 * time.Second, -7 * time.Second, 90 * time.Minute}
	start := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	for _, sc := range seedScenarios(algs) {
		for _, skew := range skews {
			t.Run(fmt.Sprintf("%s/peek=%v/skew=%v", sc.alg, sc.peek, skew), func(t *testing.T) {
				l := store.Limit{Algorithm: sc.alg, Requests: 10, Window: w}
				seedAcrossSkew(t, l, start, w, 0, skew, sc.peek)
			})
		}
	}
}

// TestSeedAcrossSkewCalendar is TestSeedAcrossSkew on calendar days of
// Berlin across the night its clocks go back (a day of 25 hours), and on a
// New York month across its end (September has 30 days, October 31), with
// the answer's trip and the clocks' skew of a real deployment: the seeded
// windows are the calendar's, shifted onto the primary's.
func TestSeedAcrossSkewCalendar(t *testing.T) {
	day, _ := calendar.Of("Europe/Berlin", algorithms.UnitDay)
	month, _ := calendar.Of("America/New_York", algorithms.UnitMonth)
	skews := []time.Duration{0, time.Nanosecond, -time.Nanosecond, time.Millisecond, -time.Millisecond,
		3 * time.Second, -3 * time.Second, 10 * time.Minute, -10 * time.Minute}
	algs := []algorithms.Kind{algorithms.KindFixedWindow, algorithms.KindSlidingWindow, algorithms.KindSlidingLog}
	for _, c := range []struct {
		cal   *calendar.Calendar
		start time.Time
		w     time.Duration
	}{
		{day, time.Date(2026, 10, 24, 0, 0, 0, 0, day.Location()), 24 * time.Hour},
		{month, time.Date(2026, 9, 1, 0, 0, 0, 0, month.Location()), 30 * 24 * time.Hour},
	} {
		for _, sc := range seedScenarios(algs) {
			for _, skew := range skews {
				t.Run(fmt.Sprintf("%v/%s/peek=%v/skew=%v", c.cal, sc.alg, sc.peek, skew), func(t *testing.T) {
					l := store.Limit{Algorithm: sc.alg, Requests: 10, Window: c.w, Calendar: c.cal}
					seedAcrossSkew(t, l, c.start.UnixNano(), c.w, 20*time.Millisecond, skew, sc.peek)
				})
			}
		}
	}
}

// seedScenario is an algorithm and whether the seed comes from a peek in
// the window after the requests (sliding_window only).
type seedScenario struct {
	alg  algorithms.Kind
	peek bool
}

func seedScenarios(algs []algorithms.Kind) []seedScenario {
	var scs []seedScenario
	for _, a := range algs {
		scs = append(scs, seedScenario{a, false})
	}
	return append(scs, seedScenario{algorithms.KindSlidingWindow, true})
}

// seedAcrossSkew runs TestSeedAcrossSkew's failover on l, whose windows
// last about w, the primary's window starting at start: its times are
// those of 10 s windows scaled to w, and the primary's last answer takes
// trip to reach the store.
func seedAcrossSkew(t *testing.T, l store.Limit, start int64, w, trip, skew time.Duration, peek bool) {
	t.Helper()
	at := func(d time.Duration) int64 { return int64(d) * int64(w/(10*time.Second)) } // d of a 10 s window, scaled
	check := store.Check{Key: "k", Limit: l, Cost: 1}
	// the primary's clock: 3.2 s into one of its windows
	p := start + at(3200*time.Millisecond)
	c := &clock{}
	s := newStore(c, Options{})
	primary := &oracle{}
	var last algorithms.Result
	for i := range 6 {
		last, _ = primary.allow(l, p+int64(i)*at(100*time.Millisecond), 1)
	}
	p += at(500*time.Millisecond) + int64(trip) // seeded as the last answer arrives
	if peek {
		// seeded from a peek 2 s into the next window, where the used
		// estimate is all the previous window's
		p += at(10*time.Second - 1700*time.Millisecond)
		last, _ = primary.allow(l, p, 0)
	}
	c.ns.Store(p + int64(skew))
	s.Seed([]store.Check{check}, []algorithms.Result{last})
	var mine, theirs int
	var firstReset bool
	step := time.Duration(at(500 * time.Millisecond))
	for call := range 60 { // three windows, a call every 500 ms
		got := decide(t, s, check)
		want, _ := primary.allow(l, p, 1)
		if !firstReset {
			firstReset = true
			if got.ResetAfter > want.ResetAfter+int64(trip) {
				t.Errorf("first answer after the seed: reset after %v, the primary's %v", time.Duration(got.ResetAfter), time.Duration(want.ResetAfter))
			}
		}
		if got.Allowed {
			mine++
		}
		if want.Allowed {
			theirs++
		}
		exact := l.Algorithm == algorithms.KindFixedWindow || l.Algorithm == algorithms.KindSlidingWindow || l.Algorithm == algorithms.KindGCRA
		if exact && (got.Allowed != want.Allowed || got.Remaining != want.Remaining) {
			t.Fatalf("call %d: answered allowed=%v remaining=%d reset=%v, the primary allowed=%v remaining=%d reset=%v", call,
				got.Allowed, got.Remaining, time.Duration(got.ResetAfter), want.Allowed, want.Remaining, time.Duration(want.ResetAfter))
		}
		if mine > theirs {
			t.Fatalf("call %d: %d admitted, the primary %d", call, mine, theirs)
		}
		p += int64(step)
		c.Advance(step)
	}
	if mine < theirs-1 {
		t.Fatalf("%d admitted over three windows, the primary %d", mine, theirs)
	}
}

// TestUnloadInDebt: a sliding window charged past its limit (debt) and a
// token bucket below zero are carried as of now: the window rolled to the
// current one (the debt is then the previous window's count), the bucket
// refilled, as for any other state.
func TestUnloadInDebt(t *testing.T) {
	c := newClock()
	s := newStore(c, Options{})
	sw := store.Limit{Algorithm: algorithms.KindSlidingWindow, Requests: 10, Window: time.Hour}
	tb := store.Limit{Algorithm: algorithms.KindTokenBucket, Requests: 10, Window: time.Hour}
	decide(t, s, store.Check{Key: "sw", Limit: sw, Cost: 15, Mode: store.Charge})
	decide(t, s, store.Check{Key: "tb", Limit: tb, Cost: 15, Mode: store.Charge})
	c.Advance(time.Hour)
	got := map[string]store.Carry{}
	if err := s.Unload(false, func(cs []store.Carry) error {
		for _, x := range cs {
			got[x.Key] = x
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	window := c.nanos() - c.nanos()%int64(time.Hour)
	if x := got["sw"]; x.Left != window+int64(time.Hour)-c.nanos() || x.Used != 0 || x.UsedPrev != 15 {
		t.Errorf("sliding window in debt, an hour on: %+v (want the window at %d, 15 in the previous one)", x, window)
	}
	if x := got["tb"]; x.Used != 5*int64(time.Hour) {
		t.Errorf("token bucket in debt, an hour on: used %d units, want 5 tokens' (%d)", x.Used, 5*int64(time.Hour))
	}
}
