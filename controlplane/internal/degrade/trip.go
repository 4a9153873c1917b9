package degrade

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults for Trip.
//
// DefaultTripFailures: five failures in a row, counted as trip.go counts
// them (attempts that overlap count once). A stalled Redis is then left
// after about five deadlines (100 ms at the default 20 ms), a refusing one
// after five quick errors; one late answer, a GC pause or a busy host that
// holds a round trip for up to four deadlines switches nothing. Waiting
// costs little: every failed attempt is still answered at once by the
// fallback, only later than the deadline would have it.
//
// DefaultTripRatio and DefaultTripWindow: half the attempts of the last
// second. A Redis that fails often without ever failing five times in a
// row (a flapping link, a server just past the deadline at its median) is
// left once it fails as often as it answers; below that, Redis still
// decides most calls and the rest are answered locally one by one. The
// ratio is judged only over at least minRatioCalls attempts, so that a
// quiet replica's one slow call is never "100% failures", and only when
// failures were seen in at least half of the window (in time): one stall,
// however many calls it fails at once, is the run rule's to judge.
const (
	DefaultTripFailures = 5
	DefaultTripRatio    = 0.5
	DefaultTripWindow   = time.Second
)

// minRatioCalls is the fewest attempts in the window over which the failure
// ratio is judged.
const minRatioCalls = 20

// tripSlots is how many slots the ratio's window is counted in: the window
// moves by a tenth of its length.
const tripSlots = 10

// Trip says when the primary's failures are sustained enough to switch to
// the fallback. A failure that does not trip it is answered by the fallback
// for that call alone. The zero value means the defaults.
type Trip struct {
	// Failures is how many failures in a row switch; 0 means
	// DefaultTripFailures, 1 switches on the first failure (as sluice did
	// before 2026-11). Failures count in a row when each attempt started
	// after the previous counted failure was seen: the calls that waited
	// on one stalled round trip fail together, and count once.
	Failures int
	// Ratio switches when at least this fraction of the attempts in the
	// last Window failed (over at least 20 attempts, with failures in at
	// least half of the Window's tenths); 0 means
	// DefaultTripRatio. A value above 1 turns the ratio off.
	Ratio float64
	// Window is the span the ratio is measured over; 0 means
	// DefaultTripWindow.
	Window time.Duration
}

// withDefaults returns t with its zero fields set to the defaults, or an
// error naming a bad field.
func (t Trip) withDefaults() (Trip, error) {
	switch {
	case t.Failures < 0:
		return t, fmt.Errorf("degrade: Trip.Failures must not be negative (got %d)", t.Failures)
	case t.Ratio < 0 || t.Ratio != t.Ratio:
		return t, fmt.Errorf("degrade: Trip.Ratio must be a fraction in (0, 1], or above 1 to turn it off (got %v)", t.Ratio)
	case t.Window < 0:
		return t, fmt.Errorf("degrade: Trip.Window must not be negative (got %v)", t.Window)
	}
	if t.Failures == 0 {
		t.Failures = DefaultTripFailures
	}
	if t.Ratio == 0 {
		t.Ratio = DefaultTripRatio
	}
	if t.Window == 0 {
		t.Window = DefaultTripWindow
	}
	if t.Window < tripSlots {
		t.Window = tripSlots // one nanosecond per slot at least
	}
	return t, nil
}

// tripper counts the primary's attempts and tells when failures are
// sustained. Successes touch only atomics; failures take a mutex. The
// ratio's counts are approximate under concurrency (a slot that turns over
// while others count in it may lose a few), exact for sequential calls.
type tripper struct {
	trip Trip
	slot int64 // slot length, ns

	run atomic.Int64 // failures in a row; successes zero it

	mu       sync.Mutex
	lastFail time.Time // when the last counted failure was seen

	slots [tripSlots]struct{ epoch, calls, fails atomic.Int64 }
}

// newTripper returns a tripper for t (with its defaults set).
func newTripper(t Trip) *tripper {
	p := &tripper{trip: t, slot: int64(t.Window) / tripSlots}
	p.reset()
	return p
}

// reset forgets every attempt, as after a return to the primary.
func (p *tripper) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.run.Store(0)
	p.lastFail = time.Time{}
	for i := range p.slots {
		p.slots[i].epoch.Store(-1)
		p.slots[i].calls.Store(0)
		p.slots[i].fails.Store(0)
	}
}

// success records an attempt that started at start and succeeded.
func (p *tripper) success(start time.Time) {
	if p.run.Load() != 0 {
		p.run.Store(0)
	}
	p.count(start.UnixNano(), false)
}

// failure records an attempt that started at start and was seen failing at
// end, and reports whether the primary should now be left.
func (p *tripper) failure(start, end time.Time) bool {
	p.count(end.UnixNano(), true)
	p.mu.Lock()
	run := p.run.Load()
	if run == 0 || !start.Before(p.lastFail) {
		run++
		p.run.Store(run)
		p.lastFail = end
	}
	p.mu.Unlock()
	if run >= int64(p.trip.Failures) {
		return true
	}
	if p.trip.Ratio > 1 {
		return false
	}
	calls, fails, failing := p.sum(end.UnixNano())
	return calls >= minRatioCalls && failing >= tripSlots/2 && float64(fails) >= p.trip.Ratio*float64(calls)
}

// count adds an attempt to the slot of time at (Unix ns).
func (p *tripper) count(at int64, failed bool) {
	e := at / p.slot
	s := &p.slots[uint64(e)%tripSlots]
	if old := s.epoch.Load(); old != e && s.epoch.CompareAndSwap(old, e) {
		s.calls.Store(0)
		s.fails.Store(0)
	}
	s.calls.Add(1)
	if failed {
		s.fails.Add(1)
	}
}

// sum returns the attempts and failures of the window that ends at at, and
// in how many of its slots failures were seen.
func (p *tripper) sum(at int64) (calls, fails int64, failing int) {
	e := at / p.slot
	for i := range p.slots {
		s := &p.slots[i]
		if ep := s.epoch.Load(); ep > e-tripSlots && ep <= e {
			calls += s.calls.Load()
			f := s.fails.Load()
			fails += f
			if f > 0 {
				failing++
			}
		}
	}
	return calls, fails, failing
}
