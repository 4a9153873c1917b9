package lease

import (
	"math"
	"time"
)

// Demand is what a replica knows about one key when it sizes its next lease.
type Demand struct {
	// Rate is this replica's recent use of the key, in units per second.
	Rate float64
	// Remaining is what Redis had left at its last answer for the key; -1
	// when unknown (no answer yet).
	Remaining int64
	// Replicas is how many replicas are active (at least 1 is assumed).
	Replicas int
	// Capacity is the limit's capacity.
	Capacity int64
}

// Policy sizes leases.
type Policy struct {
	// Target is how long a lease should last at the observed rate.
	Target time.Duration
	// Max bounds a lease.
	Max int64
}

// Size returns how many units to ask for in a lease of a key under d: enough
// for Target at the observed rate, never more than Max or the capacity, and
// never more than Remaining / Replicas, so that leases shrink as the
// budget runs out and every replica can still get a share of what is left. It returns 1
// (decide per request, the exact path without leases) when Remaining is
// unknown or the key is too close to its limit or too quiet to lease.
func (p Policy) Size(d Demand) int64 {
	if d.Remaining < 0 || d.Rate <= 0 || math.IsNaN(d.Rate) {
		return 1
	}
	want := d.Rate * p.Target.Seconds()
	if math.IsInf(want, 0) || want > float64(math.MaxInt64/2) {
		want = float64(math.MaxInt64 / 2)
	}
	k := int64(math.Ceil(want))
	k = min(k, p.Max, d.Capacity, d.Remaining/int64(max(d.Replicas, 1)))
	return max(k, 1)
}

// meter estimates a key's rate of use: an exponentially weighted average of
// the rates of periods of at least tau.
type meter struct {
	count int64     // units since start
	start time.Time // start of the current period; zero: none yet
	rate  float64   // units per second; 0 until a period ends
}

// tau is the shortest period meter averages over.
const tau = 50 * time.Millisecond

// add records n units used at now.
func (m *meter) add(now time.Time, n int64) {
	if m.start.IsZero() {
		m.start = now
	}
	m.count += n
	if d := now.Sub(m.start); d >= tau {
		r := float64(m.count) / d.Seconds()
		if m.rate == 0 {
			m.rate = r
		} else {
			m.rate = 0.5*m.rate + 0.5*r
		}
		m.count, m.start = 0, now
	}
}

// perSecond returns the estimate at now: a key idle longer than its last
// period counts as slower.
func (m *meter) perSecond(now time.Time) float64 {
	if m.start.IsZero() {
		return 0
	}
	if m.rate == 0 {
		// No period has ended yet: a key used more than once has a rate
		// already (counted over tau at least, so that a burst does not
		// count as faster than tau's worth of it); a key used once has
		// none.
		if m.count < 2 {
			return 0
		}
		return float64(m.count) / max(now.Sub(m.start), tau).Seconds()
	}
	if d := now.Sub(m.start); d > 4*tau {
		return min(m.rate, float64(m.count)/d.Seconds())
	}
	return m.rate
}
