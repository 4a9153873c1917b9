package lease

import (
	"math"
	"time"

	"github.com/sluicehq/sluice/controlplane/store"
)

// seen is a data plane that Share served, when, and the share it was
// last given: units to spend until until.
type seen struct {
	caller uint64
	at     time.Time
	units  int64
	until  time.Time
}

// maxCallers is how many data planes of a key a replica tells apart: more
// count as maxCallers (their shares are then smaller than they need, which
// only costs calls).
const maxCallers = 8

// sharers records that caller asked for a share at now, and returns its
// record and how many callers asked within recent (at least 1).
func (e *entry) sharers(caller uint64, now time.Time, recent time.Duration) (*seen, int) {
	oldest, n := 0, 0
	var rec *seen
	for i := range e.callers {
		c := &e.callers[i]
		if c.caller == caller {
			c.at, rec = now, c
		}
		if c.at.Before(e.callers[oldest].at) {
			oldest = i
		}
	}
	if rec == nil {
		rec = &e.callers[oldest]
		*rec = seen{caller: caller, at: now}
	}
	for _, c := range e.callers {
		if c.caller != 0 && now.Sub(c.at) < recent {
			n++
		}
	}
	return rec, max(n, 1)
}

// spends reports whether caller c asks again at now before the share it
// was last given ended, or within tau after (a window's end, the caller's
// next requests right behind it): a data plane calls once its share is
// spent, so it spends what it is given. One that calls later may have spent
// none of it (a key too seldom used for leases to help).
func (c *seen) spends(now time.Time) bool { return c.units > 0 && now.Before(c.until.Add(tau)) }

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
	rec, callers := e.sharers(caller, now, 2*s.policy.Target)
	spends := rec.spends(now)
	rec.units = 0
	switch {
	case e.units == 0:
		s.unshared[UnsharedNone].Add(1)
		return 0, 0
	case e.expiry.Sub(now) < minValid:
		s.unshared[UnsharedValid].Add(1)
		return 0, 0
	}
	// What this caller is expected to use before the lease ends: the
	// replica's rate (which counts the shares of callers that spend them)
	// over the callers
	// it served in the last two targets (a caller served well calls once
	// per lease). So a data plane that calls once per lease is covered
	// until then, and callers of one replica get their own parts, not each
	// all of it. A share its caller is not expected to spend a unit of in
	// time is not given: it would be lost to everyone, and cost the data
	// plane a pool to keep and renew for nothing (keys spread too thin
	// for leases to help).
	valid = e.expiry.Sub(now)
	expect := e.rate.perSecond(now) * valid.Seconds() / float64(callers)
	if expect < 1 {
		s.unshared[UnsharedSlow].Add(1)
		return 0, 0
	}
	s.shares.Add(1)
	n = min(e.units, int64(math.Ceil(expect)))
	e.units -= n
	rec.units, rec.until = n, e.expiry
	if spends {
		// counted as they are handed out, as if this replica had decided
		// them: the rate then follows the caller's own (counted once
		// spent, when the caller asks again, they arrived in one lump
		// after the time they were spent in, and calls close together
		// made a key look many times faster than it was)
		e.rate.add(now, n)
	}
	s.shared.Add(n)
	return n, valid
}
