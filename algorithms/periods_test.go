package algorithms

import (
	"math/rand"
	"sort"
	"testing"
)

// partition cuts the time line into periods of lengths between min and
// max, as a calendar does (months of 28 to 31 days, days of 23 to 25 hours),
// made as far as they are asked for.
type partition struct {
	rng        *rand.Rand
	min, max   int64
	boundaries []int64 // increasing; period k is [boundaries[k], boundaries[k+1])
}

func newPartition(rng *rand.Rand, origin, lo, hi int64) *partition {
	return &partition{rng: rng, min: lo, max: hi, boundaries: []int64{origin}}
}

// index returns k such that period k holds t (t at or after the origin).
func (p *partition) index(t int64) int {
	for p.boundaries[len(p.boundaries)-1] <= t+3*p.max {
		last := p.boundaries[len(p.boundaries)-1]
		p.boundaries = append(p.boundaries, last+p.min+p.rng.Int63n(p.max-p.min+1))
	}
	return sort.Search(len(p.boundaries), func(i int) bool { return p.boundaries[i] > t }) - 1
}

// at returns the periods around t; t is at least two periods after the
// origin.
func (p *partition) at(t int64) *Periods {
	k := p.index(t)
	b := p.boundaries
	return &Periods{Prev: b[k-1], Start: b[k], End: b[k+1], Next: b[k+2]}
}

// periodic is a subject whose limit takes Periods.
type periodic interface {
	subject
	setPeriods(*Periods)
}

func (x *fixedSubject) setPeriods(p *Periods)   { x.l.Periods = p }
func (x *slidingSubject) setPeriods(p *Periods) { x.l.Periods = p }
func (x *logSubject) setPeriods(p *Periods)     { x.l.Periods = p }

// calendarSubject sets its limit's periods from a partition at every call.
type calendarSubject struct {
	periodic
	p *partition
}

func (x *calendarSubject) allow(now, cost int64) (Result, error) {
	x.setPeriods(x.p.at(now))
	return x.periodic.allow(now, cost)
}

func (x *calendarSubject) refund(now, amount int64) (Result, error) {
	x.setPeriods(x.p.at(now))
	return x.periodic.refund(now, amount)
}

func (x *calendarSubject) clone() subject {
	return &calendarSubject{x.periodic.clone().(periodic), x.p}
}

// periodAlgorithms are the algorithms that take Periods.
var periodAlgorithms = []string{"fixed_window", "sliding_window", "sliding_log"}

// newCalendarSubject returns a limiter of alg on periods of p, from a
// random subject of the same parameters.
func newCalendarSubject(rng *rand.Rand, alg string, p *partition) *calendarSubject {
	name := alg
	if alg == "fixed_window" {
		name = "fixed_aligned"
	}
	return &calendarSubject{randomSubjects(rng, name).(periodic), p}
}

// TestPeriodsProperties is TestRefundProperties on periods of lengths
// from half to twice a window, as calendars have: every result valid,
// retries exact, full after ResetAfter, and, net of refunds, at most Limit
// in every period (fixed_window, sliding_window) and in every sliding
// window (edge(t), t] (sliding_log).
func TestPeriodsProperties(t *testing.T) {
	for _, alg := range periodAlgorithms {
		t.Run(alg, func(t *testing.T) {
			rng := rand.New(rand.NewSource(int64(len(alg)) * 6151))
			for steps := 0; steps < 20000; steps += sequence {
				w := 2 + rng.Int63n(5000)
				now := rng.Int63n(1 << 40)
				p := newPartition(rng, now-8*w, max(1, w/2), 2*w)
				x := newCalendarSubject(rng, alg, p)
				checkPeriodBound(t, alg, x, p, exercise(t, alg, rng, x, now, true))
			}
		})
	}
}

// checkPeriodBound checks the bound of alg over adm.
func checkPeriodBound(t *testing.T, alg string, x subject, p *partition, adm []admission) {
	t.Helper()
	limit := x.capacity()
	if alg != "sliding_log" {
		per := map[int]int64{}
		for _, a := range adm {
			k := p.index(a.at)
			if per[k] += a.cost; per[k] > limit {
				t.Fatalf("%s: period %d admitted %d > %d", alg, k, per[k], limit)
			}
		}
		return
	}
	l := x.(*calendarSubject).periodic.(*logSubject).l
	for j, a := range adm {
		l.Periods = p.at(a.at)
		edge := l.edge(a.at)
		var sum int64
		for _, b := range adm[:j+1] {
			if b.at > edge {
				sum += b.cost
			}
		}
		if sum > limit {
			t.Fatalf("sliding_log: (%d, %d] admitted %d > %d", edge, a.at, sum, limit)
		}
	}
}

// TestPeriodsOfOneLength: periods all of length W, aligned to multiples of
// W, give exactly what windows of W do, for every call of a random
// sequence.
func TestPeriodsOfOneLength(t *testing.T) {
	for _, alg := range periodAlgorithms {
		t.Run(alg, func(t *testing.T) {
			rng := rand.New(rand.NewSource(int64(len(alg)) * 7))
			for range 50 {
				x := newCalendarSubject(rng, alg, nil)
				plain := x.periodic.clone() // windows of their Window
				var w int64
				switch c := plain.(type) {
				case *fixedSubject:
					w = c.l.Window
				case *slidingSubject:
					w = c.l.Window
				case *logSubject:
					w = c.l.Window
				}
				now := rng.Int63n(1 << 40)
				x.p = newPartition(rng, (now/w-4)*w, w, w)
				for range sequence {
					now += rng.Int63n(3 * w / 2)
					cost := rng.Int63n(x.capacity() + 1)
					var a, b Result
					if rng.Intn(4) == 0 {
						a, _ = x.refund(now, cost)
						b, _ = plain.refund(now, cost)
					} else {
						a, _ = x.allow(now, cost)
						b, _ = plain.allow(now, cost)
					}
					if a != b {
						t.Fatalf("%s at %d cost %d: with periods %+v, with window %d %+v", alg, now, cost, a, w, b)
					}
				}
			}
		})
	}
}

// TestPeriodsAcrossLengths: a calendar month's budget across months of
// different lengths, in whole days.
func TestPeriodsAcrossLengths(t *testing.T) {
	const day = 24 * 3600 * sec
	jan, feb, mar, apr := int64(0), 31*day, 59*day, 90*day // 2026: January has 31 days, February 28
	dec := jan - 31*day
	at := func(t int64) *Periods {
		switch {
		case t < feb:
			return &Periods{dec, jan, feb, mar}
		case t < mar:
			return &Periods{jan, feb, mar, apr}
		}
		return &Periods{feb, mar, apr, apr + 31*day}
	}
	t.Run("fixed_window", func(t *testing.T) {
		l := FixedWindow{Limit: 3, Window: 30 * day}
		var s FixedWindowState
		l.Periods = at(feb + 10*day)
		r, _ := l.Allow(&s, feb+10*day, 3)
		if r.ResetAfter != mar-(feb+10*day) {
			t.Fatalf("reset %v, want until March 1st", r.ResetAfter)
		}
		r, _ = l.Allow(&s, feb+10*day, 1)
		if r.Allowed || r.RetryAfter != 18*day {
			t.Fatalf("%+v, want refused until March 1st (18 days)", r)
		}
		l.Periods = at(mar)
		if r, _ := l.Allow(&s, mar, 1); !r.Allowed || r.ResetAfter != 31*day {
			t.Fatalf("%+v, want allowed, March's 31 days to go", r)
		}
	})
	t.Run("sliding_log", func(t *testing.T) {
		// A request of January 30 leaves at the end of February (it has no
		// 30th); one of February 10 on March 10.
		l := SlidingLog{Limit: 2, Window: 30 * day}
		s := l.NewState()
		l.Periods = at(jan + 29*day)
		l.Allow(s, jan+29*day, 1)
		l.Periods = at(feb + 9*day)
		l.Allow(s, feb+9*day, 1)
		r, _ := l.Allow(s, feb+9*day, 1)
		if r.Allowed || r.RetryAfter != mar-(feb+9*day) {
			t.Fatalf("%+v, want refused until March 1st", r)
		}
		l.Periods = at(mar)
		r, _ = l.Allow(s, mar, 1)
		if !r.Allowed || r.Remaining != 0 || r.RetryAfter != 0 || r.ResetAfter != 31*day {
			t.Fatalf("%+v, want allowed, none left, full again on April 1st", r)
		}
		r, _ = l.Allow(s, mar, 1)
		if r.Allowed || r.RetryAfter != 9*day {
			t.Fatalf("%+v, want refused until March 10", r)
		}
	})
}

// TestPeriodsInvalid: periods out of order, or that do not hold now, are
// refused and change nothing.
func TestPeriodsInvalid(t *testing.T) {
	var s FixedWindowState
	for _, c := range []struct {
		p   Periods
		now int64
		err error
	}{
		{Periods{0, 10, 10, 30}, 10, ErrPeriods},
		{Periods{0, 10, 20, 30}, 20, ErrPeriodsNow},
		{Periods{0, 10, 20, 30}, 9, ErrPeriodsNow},
		{Periods{-1 << 62, 10, 20, 1 << 62}, 15, ErrPeriodsTooLong},
	} {
		l := FixedWindow{Limit: 1, Window: 10, Periods: &c.p}
		if _, err := l.Allow(&s, c.now, 1); err != c.err {
			t.Errorf("%+v at %d: err %v, want %v", c.p, c.now, err, c.err)
		}
	}
	if s != (FixedWindowState{}) {
		t.Fatalf("refused calls changed the state: %+v", s)
	}
}
