package lease

import (
	"math"
	"time"

	"github.com/sluicehq/sluice/controlplane/store"
)

// seen is a data plane that Share served, and when.
type seen struct {
	caller uint64
	at     time.Time
}

// maxCallers is how many data planes of a key a replica tells apart: more
// count as maxCallers (their shares are then smaller than they need, which
// only costs calls).
const maxCallers = 8

// sharers records that caller asked for a share at now, and returns how
// many callers asked within recent (at least 1).
func (e *entry) sharers(caller uint64, now time.Time, recent time.Duration) int {
	oldest, n, found := 0, 0, false
	for i := range e.callers {
		c := &e.callers[i]
		if c.caller == caller {
			c.at, found = now, true
		}
		if c.at.Before(e.callers[oldest].at) {
			oldest = i
		}
	}
	if !found {
		e.callers[oldest] = seen{caller: caller, at: now}
	}
	for _, c := range e.callers {
		if c.caller != 0 && now.Sub(c.at) < recent {
			n++
		}
	}
	return max(n, 1)
}

// Share hands part of this replica's unspent lease on key (of limit l) to
// the data plane caller, which may admit that many requests of the key on
// its own until valid has passed (nothing when less than minValid is
// left): what this replica expects that caller to use before the lease
// ends, its rate divided among the callers it served lately, up to all it
// holds. The units leave this replica's lease at once, so that they are
// spent once; they were debited in Redis when leased. It returns 0 when
// there is nothing to share.
func (s *Store) Share(key string, l store.Limit, minValid time.Duration, caller uint64) (n int64, valid time.Duration) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.keys[key]
	if e == nil || e.limit != l {
		s.unshared[UnsharedNone].Add(1)
		return 0, 0
	}
	// it asks, so it spends: counted whether or not it gets a share
	callers := e.sharers(caller, now, 2*s.policy.Target)
	switch {
	case e.units == 0:
		s.unshared[UnsharedNone].Add(1)
		return 0, 0
	case e.expiry.Sub(now) < minValid:
		s.unshared[UnsharedValid].Add(1)
		return 0, 0
	}
	s.shares.Add(1)
	// What this caller is expected to use before the lease ends: the
	// replica's rate (which counts the units it shared) over the callers
	// it served in the last two targets (a caller served well calls once
	// per lease). So a data plane that calls once per lease is covered
	// until then, callers of one replica get their own parts, not each
	// all of it, and a share nobody can spend in time, which would be lost
	// to everyone, is not given.
	valid = e.expiry.Sub(now)
	n = min(e.units, max(1, int64(math.Ceil(e.rate.perSecond(now)*valid.Seconds()/float64(callers)))))
	e.units -= n
	e.rate.add(now, n)
	s.shared.Add(n)
	return n, valid
}
