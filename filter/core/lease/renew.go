package lease

import (
	"bytes"

	"github.com/sluicehq/sluice/filter/core/config"
	"github.com/sluicehq/sluice/filter/core/descriptors"
	"github.com/sluicehq/sluice/filter/core/rlsproto"
)

// Prefetch: the renewal of the proxy's lease pools in calls no request
// waits on (lease_prefetch, on by default). Without it, a pool is renewed
// by the call of the request that finds it empty, and that request is
// decided by the call; with it:
//
//   - a request that takes one of the last units of a pool (fewer left than
//     the pool's drain rate covers during two round trips of a call, and at
//     least the last one) sends a renewal from the worker, and goes on at
//     once;
//   - when a pool that a worker spent from ends (its valid_until: a
//     window's end, a token bucket's lease's), the worker's tick renews it
//     Gap later, once the control plane's lease behind it has ended too
//     (the control plane ends a quota 10 ms before its lease), so that the
//     next lease's share can be granted;
//   - a request that finds its pool ended and no renewal under way starts
//     one (sent at once, or Gap after the end), and waits for it.
//
// A renewal is the RateLimitRequest the key's requests send (the domain,
// that one descriptor, the caller in rlsproto.QuotaField), of cost 1: the
// control plane grants a share only to a call of cost 1 (a probe of cost 0
// leases nothing), so an OK answer debited one unit. For a window limit
// (fixed_window, sliding_window, as the answer's metadata says) that unit
// goes into the pool with the share (quota.requests units in all, until
// its valid_until, which is within the window the unit was debited in).
// For any other algorithm the control plane may have debited it on its
// per-request path, outside a lease: a token_bucket or gcra unit debited
// now and spent later would let the bucket refill meanwhile, one unit more
// than the algorithm admits. So that unit, and the unit of an OK answer
// without a quota, admits a request of the worker that waits for the pool
// now, as that request's own call would have, or is lost
// (sluice.lease_renewal_lost): it only admits less. An OVER_LIMIT answer
// debited nothing and teaches the precheck, as any answer does.
//
// Across the proxy's workers, one renewal (or request's call) per key is
// under way at a time: the pool records it (Pools.Renew, the record Ask
// makes), and requests that find the pool empty meanwhile wait for it. A
// renewal that brings no units, fails or times out ends the record
// (Answered): the waiters wake and take a unit or call; that key is then
// not renewed for Backoff.
//
// Bounds: a worker renews only the MaxRecent keys it last spent from (their
// precheck key and request frame, at most about 2 × the longest key each),
// never a usage-based descriptor nor one of cost other than 1, and never
// more than MaxRenewals at once. An idle key is renewed at most once after
// the last lease a worker spent from: the cost of prefetch is at most one
// call (and one share left unspent) per key and lease that was spent from.
const (
	MaxRecent   = 32
	MaxRenewals = 8
	Gap         = 15 * config.Millisecond
	Backoff     = 250 * config.Millisecond
	// minSpan is the least time over which a pool's drain rate is measured
	// before it sizes the renewal's threshold (a burst of a few requests
	// says little about the rate).
	minSpan    = 50 * config.Millisecond
	defaultRTT = 5 * config.Millisecond
)

// Entry is a key a worker spent a lease unit of lately, and its renewal.
type Entry struct {
	Key       []byte // the descriptor's precheck key
	RateLimit int    // the index of its rate limit
	Frame     []byte // the renewal's RateLimitRequest, in gRPC's framing
	// CallID and SentAt are the renewal's call while InFlight.
	CallID uint32
	SentAt int64
	used   bool
	// until is the end of the pool the worker last took from, and spent
	// says it took from it: renew when it ends (the tick).
	until int64
	spent bool
	took  int64 // the worker's last take
	// The pool's units left at markAt, when the worker first saw it: its
	// drain rate since.
	markLeft, markAt int64
	// renewing: the pool records this worker's renewal as under way, sent
	// (InFlight) or to be sent at sendAt.
	renewing, InFlight bool
	sendAt             int64
	dryUntil           int64 // no renewal before then: the last brought nothing
}

// Renewer is a worker's prefetch bookkeeping: which keys it spent from,
// how fast, and which renewals are under way. It makes no call itself: it
// says when to renew, and the worker does.
type Renewer struct {
	On      bool
	keys    [MaxRecent]Entry
	pending int   // keys renewing
	rtt     int64 // the renewals' round trip, smoothed
	domain  string
	caller  uint64
}

// NewRenewer returns the prefetch bookkeeping of a worker of domain that
// names itself caller to the control plane; on is lease_prefetch.
func NewRenewer(on bool, domain string, caller uint64) Renewer {
	return Renewer{On: on, rtt: defaultRTT, domain: domain, caller: caller}
}

// find returns the recent entry of key, or nil.
func (r *Renewer) find(key []byte) *Entry {
	for i := range r.keys {
		if e := &r.keys[i]; e.used && bytes.Equal(e.Key, key) {
			return e
		}
	}
	return nil
}

// Recent returns the entry of key, made from its descriptor one (a slice of
// one) if there is none and one is given: it replaces a free entry, or the
// one spent from longest ago that is not renewing. nil when there is none
// to replace.
func (r *Renewer) Recent(key []byte, one []descriptors.Descriptor) *Entry {
	if e := r.find(key); e != nil || one == nil {
		return e
	}
	var e *Entry
	for i := range r.keys {
		c := &r.keys[i]
		if !c.used {
			e = c
			break
		}
		if !c.renewing && (e == nil || c.took < e.took) {
			e = c
		}
	}
	if e == nil {
		return nil
	}
	*e = Entry{Key: append(e.Key[:0], key...), RateLimit: one[0].RateLimit, used: true,
		Frame: rlsproto.AppendRequestFrame(e.Frame[:0], r.domain, one, r.caller)}
	return e
}

// Took is told that the worker took a unit of e's pool, which then held
// left units until until. fresh says that the pool is another one (or
// holds more units) than e last saw: its end is a new thing due. low > 0
// says to renew the pool now, while it holds fewer than low units (fewer
// than its drain rate uses during two round trips).
func (r *Renewer) Took(e *Entry, left, until, now int64) (fresh bool, low int64) {
	if until != e.until || left > e.markLeft || !e.spent {
		// another pool (or more units in it): measure its rate from here,
		// and renew it when it ends
		fresh = until != e.until || !e.spent
		e.until, e.markLeft, e.markAt, e.spent = until, left, now, true
	}
	e.took = now
	if e.renewing || now < e.dryUntil || r.pending >= MaxRenewals {
		return fresh, 0
	}
	if need := e.need(left, now, r.rtt); left < need {
		return fresh, need
	}
	return fresh, 0
}

// need returns how many units of its pool e's key is expected to use
// during two round trips of a call (at least 1: a renewal is sent when the
// last unit is taken, at the latest).
func (e *Entry) need(left, now, rtt int64) int64 {
	used, span := e.markLeft-left, now-e.markAt
	if used <= 0 || span < minSpan {
		return 1
	}
	lead := 2*rtt + config.Millisecond
	return max(1, (used*lead+span-1)/span)
}

// MayRenew reports whether e may be renewed at now: it is not renewing,
// its last renewal's backoff is over, and fewer than MaxRenewals are under
// way.
func (r *Renewer) MayRenew(e *Entry, now int64) bool {
	return e != nil && !e.renewing && now >= e.dryUntil && r.pending < MaxRenewals
}

// Started records that the pool records e's renewal as under way; it is to
// be sent at sendAt (at once when sendAt is not after now).
func (r *Renewer) Started(e *Entry, sendAt int64) {
	e.renewing, e.sendAt = true, sendAt
	r.pending++
}

// Sent records that e's renewal was sent at now as call id.
func (r *Renewer) Sent(e *Entry, id uint32, now int64) {
	e.InFlight, e.CallID, e.SentAt = true, id, now
}

// Answered records the round trip of e's renewal, answered at now.
func (r *Renewer) Answered(e *Entry, now int64) {
	r.rtt = (3*r.rtt + max(now-e.SentAt, 0)) / 4
}

// Ended ends e's renewal: unless it brought units, the key is not renewed
// for Backoff.
func (r *Renewer) Ended(e *Entry, now int64, granted bool) {
	e.renewing, e.InFlight = false, false
	r.pending--
	if granted {
		e.dryUntil = 0
	} else {
		e.dryUntil = now + Backoff
	}
}

// The things Due finds to do for an entry.
const (
	SendNow  = iota + 1 // send the renewal deferred until now
	RenewNow            // renew the pool the worker spent from, which ended Gap ago
)

// Due returns the next entry from i on with something to do at now, what
// (SendNow, RenewNow), and the index to go on from; nil when there is none
// left. An entry whose pool ended long ago (Recent) is forgotten as it is
// passed; one that RenewNow names is renewed once only (an idle key is not
// renewed again).
func (r *Renewer) Due(i int, now int64) (e *Entry, what, next int) {
	for ; i < len(r.keys); i++ {
		e := &r.keys[i]
		switch {
		case !e.used, e.InFlight:
		case e.renewing:
			if now >= e.sendAt {
				return e, SendNow, i + 1
			}
		case e.spent && now-e.until >= Recent:
			e.spent = false // long gone: no lease to renew
		case e.spent && now >= e.until+Gap && now >= e.dryUntil && r.pending < MaxRenewals:
			e.spent = false // renewed once: an idle key is not renewed again
			return e, RenewNow, i + 1
		}
	}
	return nil, 0, i
}

// NextDue returns when the renewer next has something to do on the tick;
// timeout is the renewals' timeout and grace (an answer overdue).
func (r *Renewer) NextDue(timeout int64) (due int64, ok bool) {
	if !r.On {
		return 0, false
	}
	for i := range r.keys {
		e := &r.keys[i]
		var t int64
		switch {
		case !e.used:
			continue
		case e.InFlight:
			t = e.SentAt + timeout + 1
		case e.renewing:
			t = e.sendAt
		case e.spent && r.pending < MaxRenewals:
			t = max(e.until+Gap, e.dryUntil)
		default:
			continue
		}
		if !ok || t < due {
			due, ok = t, true
		}
	}
	return due, ok
}

// End is the end of the pool that e's worker took from last.
func (e *Entry) End() int64 { return e.until }

// Full reports whether MaxRenewals renewals are under way: no other may
// start.
func (r *Renewer) Full() bool { return r.pending >= MaxRenewals }
