package algorithms

import (
	"math/rand"
	"testing"
)

// checkRefund refunds amount at now on x and checks the result: valid, the
// peek of the state after it, never less remaining than before nor more
// than amount on top.
func checkRefund(t *testing.T, name string, x subject, now, amount int64) {
	t.Helper()
	before, _ := x.clone().allow(now, 0)
	r, err := x.refund(now, amount)
	if err != nil {
		t.Fatalf("%s: refund %d at %d: %v", name, amount, now, err)
	}
	if r.Remaining < 0 || r.Remaining > r.Limit || r.Limit != x.capacity() || r.ResetAfter < 0 || r.RetryAfter < 0 {
		t.Fatalf("%s: bad refund result %+v", name, r)
	}
	if peek, _ := x.clone().allow(now, 0); peek != r {
		t.Fatalf("%s: refund answered %+v, a peek after it %+v", name, r, peek)
	}
	if r.Remaining < before.Remaining || r.Remaining > before.Remaining+amount {
		t.Fatalf("%s: refund of %d took remaining from %d to %d", name, amount, before.Remaining, r.Remaining)
	}
}

// TestRefundProperties is TestProperties with refunds among the requests
// (part of what the last admission took, at its time or later): every
// result stays valid, a refund answers a peek of the state after it, and
// the admission bounds hold net of refunds (a refund counts as a negative
// admission at its time).
func TestRefundProperties(t *testing.T) {
	for _, name := range propertyAlgorithms {
		t.Run(name, func(t *testing.T) {
			rng := rand.New(rand.NewSource(int64(len(name)) * 104729))
			for steps := 0; steps < 20000; steps += sequence {
				x := randomSubjects(rng, name)
				checkBound(t, name, x, exercise(t, name, rng, x, rng.Int63n(1<<40), true))
			}
		})
	}
}

// TestRefundUndoes: a request admitted and refunded whole at the same
// instant leaves the limiter answering as if it never came (reserve: never
// fuller than that, since its free ticket moves back by whole time units).
func TestRefundUndoes(t *testing.T) {
	for _, name := range propertyAlgorithms {
		t.Run(name, func(t *testing.T) {
			rng := rand.New(rand.NewSource(int64(len(name)) * 31))
			for range 2000 {
				x := randomSubjects(rng, name)
				now := rng.Int63n(1 << 40)
				for range rng.Intn(20) {
					now += rng.Int63n(100)
					x.allow(now, 1+rng.Int63n(x.capacity()))
				}
				cost := 1 + rng.Int63n(x.capacity())
				want, _ := x.clone().allow(now, 0)
				if r, _ := x.allow(now, cost); !r.Allowed {
					continue
				}
				got, err := x.refund(now, cost)
				if err != nil {
					t.Fatal(err)
				}
				if name == "reserve" {
					if got.Remaining > want.Remaining || got.Wait < want.Wait {
						t.Fatalf("reserve: after admit and refund %+v, before %+v: fuller than before", got, want)
					}
					continue
				}
				if got != want {
					t.Fatalf("%s: after admit and refund of %d: %+v, before: %+v", name, cost, got, want)
				}
			}
		})
	}
}

// TestRefund: what a refund gives back and its floor, per algorithm.
func TestRefund(t *testing.T) {
	t.Run("fixed_window", func(t *testing.T) {
		l := FixedWindow{Limit: 10, Window: 10 * sec, Aligned: true}
		s := FixedWindowState{Start: 10 * sec, Count: 12} // in debt
		r, _ := l.Refund(&s, 12*sec, 5)
		if s.Count != 7 || !r.Allowed || r.Remaining != 3 || r.ResetAfter != 8*sec {
			t.Fatalf("state %+v result %+v, want count 7, remaining 3", s, r)
		}
		r, _ = l.Refund(&s, 12*sec, 100) // floor
		if s.Count != 0 || r.Remaining != 10 {
			t.Fatalf("state %+v result %+v, want count 0", s, r)
		}
		s = FixedWindowState{Start: 0, Count: 9} // a window that ended
		l.Refund(&s, 12*sec, 4)
		if s.Count != 0 {
			t.Fatalf("a refund in a new window gave back %+v", s)
		}
	})
	t.Run("sliding_window", func(t *testing.T) {
		l := SlidingWindow{Limit: 10, Window: 10 * sec}
		s := SlidingWindowState{Start: 10 * sec, Prev: 8, Cur: 3}
		r, _ := l.Refund(&s, 15*sec, 5) // prev weighs 0.5: 4 + 0
		if s.Cur != 0 || s.Prev != 8 || r.Remaining != 6 {
			t.Fatalf("state %+v result %+v, want cur 0, prev 8, remaining 6", s, r)
		}
	})
	t.Run("sliding_log", func(t *testing.T) {
		l := SlidingLog{Limit: 10, Window: 10 * sec}
		s := l.NewState()
		for i, c := range []int64{2, 3, 4} {
			l.Allow(s, int64(i+1)*sec, c)
		}
		r, _ := l.Refund(s, 4*sec, 5) // the 4 at 3s, then 1 of the 3 at 2s
		if s.Total() != 4 || r.Remaining != 6 || r.ResetAfter != 12*sec-4*sec {
			t.Fatalf("total %d result %+v, want total 4, reset when the entry of 2s leaves", s.Total(), r)
		}
		if at, _ := s.Newest(); at != 2*sec {
			t.Fatalf("newest at %d, want 2s", at)
		}
	})
	t.Run("token_bucket", func(t *testing.T) {
		l := TokenBucket{Rate: 1, Period: sec, Burst: 10}
		s := TokenBucketState{Last: 0, Used: 12 * sec} // 2 in debt
		r, _ := l.Refund(&s, sec, 3)                   // refilled 1: used 11, then 8
		if s.Used != 8*sec || r.Remaining != 2 {
			t.Fatalf("state %+v result %+v, want used 8 tokens", s, r)
		}
		l.Refund(&s, sec, 20)
		if s.Used != 0 {
			t.Fatalf("the bucket went past full: %+v", s)
		}
	})
	t.Run("gcra", func(t *testing.T) {
		l := GCRA{MaxBurst: 4, Count: 1, Period: sec}
		s := GCRAState{TAT: 10 * sec}
		r, _ := l.Refund(&s, 2*sec, 3)
		if s.TAT != 7*sec || r.ResetAfter != 5*sec {
			t.Fatalf("state %+v result %+v, want TAT 7s", s, r)
		}
		l.Refund(&s, 2*sec, 100)
		if s.TAT != 2*sec {
			t.Fatalf("TAT %d moved before now", s.TAT)
		}
	})
	t.Run("reserve", func(t *testing.T) {
		l := Reserve{Rate: 1, Period: sec, Burst: 4, MaxWait: 10 * sec}
		s := ReserveState{Next: 5 * sec, Missing: 4 * sec} // empty, 3s of debt at 2s
		r, _ := l.Refund(&s, 2*sec, 5)                     // 3s of ticket, then 2 permits
		if s.Next != 2*sec || s.Missing != 2*sec || r.Remaining != 2 || r.Wait != 0 {
			t.Fatalf("state %+v result %+v, want ticket at now, 2 permits stored", s, r)
		}
	})
}

// TestRefundAllocs: refunds, like decisions, allocate nothing.
func TestRefundAllocs(t *testing.T) {
	fw := FixedWindow{Limit: 10, Window: sec, Aligned: true}
	sw := SlidingWindow{Limit: 10, Window: sec}
	sl := SlidingLog{Limit: 10, Window: sec}
	tb := TokenBucket{Rate: 10, Period: sec, Burst: 10}
	gc := GCRA{MaxBurst: 9, Count: 10, Period: sec}
	rs := Reserve{Rate: 10, Period: sec, Burst: 10, MaxWait: sec}
	var fs FixedWindowState
	var ss SlidingWindowState
	ls := sl.NewState()
	var ts TokenBucketState
	var gs GCRAState
	var rss ReserveState
	now := int64(1 << 40)
	n := testing.AllocsPerRun(100, func() {
		now += 1000
		fw.Allow(&fs, now, 2)
		fw.Refund(&fs, now, 1)
		sw.Allow(&ss, now, 2)
		sw.Refund(&ss, now, 1)
		sl.Allow(ls, now, 2)
		sl.Refund(ls, now, 1)
		tb.Allow(&ts, now, 2)
		tb.Refund(&ts, now, 1)
		gc.Allow(&gs, now, 2)
		gc.Refund(&gs, now, 1)
		rs.Allow(&rss, now, 2)
		rs.Refund(&rss, now, 1)
	})
	if n != 0 {
		t.Fatalf("%v allocations per round", n)
	}
}
