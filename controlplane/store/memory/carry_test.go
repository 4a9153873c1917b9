package memory

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice/controlplane/store"
	"github.com/sluicehq/sluice/shared/algorithms"
)

// TestSeedNeverAdmitsMore seeds the store from a primary's answer (the
// primary here is shared/algorithms with its own state) and then sends the
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
				exact := l.Algorithm == store.FixedWindow || l.Algorithm == store.GCRA
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
	l := store.Limit{Algorithm: store.FixedWindow, Requests: 10, Window: time.Hour}
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
	start := (c.nanos() + int64(30*time.Minute) - 1) / int64(time.Hour) * int64(time.Hour)
	for _, step := range []struct {
		drain, fail bool
		want        []store.Carry
	}{
		{false, true, []store.Carry{{Key: "k", Limit: l, Start: start, Base: 6, Used: 8}}},
		{false, false, []store.Carry{{Key: "k", Limit: l, Start: start, Base: 6, Used: 8}}},
		{false, false, nil}, // nothing new
		{true, false, []store.Carry{{Key: "k", Limit: l, Start: start, Base: 0, Used: 1}}}, // after one more
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

// TestUnloadInDebt: a sliding window charged past its limit (debt) and a
// token bucket below zero are carried as of now: the window rolled to the
// current one (the debt is then the previous window's count), the bucket
// refilled, as for any other state.
func TestUnloadInDebt(t *testing.T) {
	c := newClock()
	s := newStore(c, Options{})
	sw := store.Limit{Algorithm: store.SlidingWindow, Requests: 10, Window: time.Hour}
	tb := store.Limit{Algorithm: store.TokenBucket, Requests: 10, Window: time.Hour}
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
	if x := got["sw"]; x.Start != window || x.Used != 0 || x.UsedPrev != 15 {
		t.Errorf("sliding window in debt, an hour on: %+v (want the window at %d, 15 in the previous one)", x, window)
	}
	if x := got["tb"]; x.Used != 5*int64(time.Hour) {
		t.Errorf("token bucket in debt, an hour on: used %d units, want 5 tokens' (%d)", x.Used, 5*int64(time.Hour))
	}
}
