package lease

import (
	"bytes"

	"github.com/sluicehq/sluice/filter/core/config"
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
//     one (sent at once, or Gap after the end), and waits for it, when its
//     worker saw the pool drain; otherwise it makes its own call.
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
// A worker prefetches only a pool it saw drain by at least minDrain units,
// its own first take included (its key's requests spend what is granted):
// a pool taken from once belongs to a key too seldom used for a renewal's
// share to be spent before it ends, and is left to the request that finds
// it empty, whose own call asks for the next.
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
	minDrain   = 2
	defaultRTT = 5 * config.Millisecond
)

// Entry is a key a worker spent a lease unit of lately, and its renewal.
type Entry struct {
	Key []byte // the descriptor's precheck key (package descriptors' AppendKey)
	// CallID and SentAt are the renewal's call while InFlight.
	CallID uint32
	SentAt int64
	used   bool
	// until is the end of the pool the worker last took from, and spent
	// says it took from it: renew when it ends (the tick).
	until int64
	spent bool
	took  int64 // the worker's last take
	// The pool's units left at markAt, when the worker first saw it, and
	// at the worker's last take: its drain rate since.
	markLeft, markAt, left int64
	// renewing: the pool records this worker's renewal as under way, sent
	// (InFlight) or to be sent at sendAt.
	renewing, InFlight bool
	sendAt             int64
	dryUntil           int64 // no renewal before then: the last brought nothing
}

// Renewer is a worker's prefetch: which keys it spent from, how fast, and
// the renewals under way, which it starts and sends through its Env. The
// worker applies a renewal's answer (it teaches the precheck and may admit
// a waiting request) and ends it with End.
type Renewer struct {
	On      bool
	keys    [MaxRecent]Entry
	pending int   // keys renewing
	rtt     int64 // the renewals' round trip, smoothed
	timeout int64 // a renewal call's
	pools   Pools
	env     Env
}

// Env is what a Renewer needs from its worker.
type Env interface {
	// Send sends e's renewal (the RateLimitRequest the key's requests send,
	// of cost 1: a call no request waits on) and returns the call's id; its
	// answer comes back to the worker.
	Send(e *Entry, now int64) (uint32, error)
	// Wake wakes the worker's requests that wait for key's pool.
	Wake(key []byte)
	// Changed is told that the renewals' next due time may have changed.
	Changed(now int64)
	// Warn logs a warning.
	Warn(msg string)
}

// NewRenewer returns the prefetch of a worker, renewing pools through env
// with calls of timeout; on is lease_prefetch.
func NewRenewer(on bool, timeout int64, pools Pools, env Env) *Renewer {
	return &Renewer{On: on, rtt: defaultRTT, timeout: timeout, pools: pools, env: env}
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

// recent returns the entry of key, made if there is none and create says
// so: it replaces a free entry, or the one spent from longest ago that is
// not renewing. nil when there is none to replace.
func (r *Renewer) recent(key []byte, create bool) *Entry {
	if e := r.find(key); e != nil || !create {
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
	*e = Entry{Key: append(e.Key[:0], key...), used: true}
	return e
}

// NoteTake is told that the worker took a unit of key's pool, which then
// held left units until until; create says to keep track of key if it is
// not yet (a request decided now, not one resumed after a wait). It renews
// the pool when fewer units are left than its drain rate uses during two
// round trips.
func (r *Renewer) NoteTake(key []byte, create bool, left, until, now int64) {
	e := r.recent(key, create)
	if e == nil {
		return
	}
	if until != e.until || left > e.markLeft || !e.spent {
		// another pool (or more units in it): measure its rate from here,
		// and renew it when it ends
		fresh := until != e.until || !e.spent
		e.until, e.markLeft, e.markAt, e.spent = until, left, now, true
		if fresh {
			r.env.Changed(now) // its end is due
		}
	}
	e.took, e.left = now, left
	if e.renewing || now < e.dryUntil || r.pending >= MaxRenewals {
		return
	}
	if need := e.need(left, now, r.rtt); left < need {
		r.start(e, now, now, need)
	}
}

// RenewEnded is told that a request (of one descriptor, whose key is key)
// found its pool, which ended at end, without a unit at now: it starts a
// renewal for the request to wait for, unless one cannot be made. A pool
// that ended is renewed Gap after its end. Only a pool the worker saw
// drain: the request of a key too seldom used makes its own call, which
// asks for a quota as a renewal would, and it does not wait.
func (r *Renewer) RenewEnded(key []byte, end, now int64) {
	if !r.On || r.pending >= MaxRenewals {
		return
	}
	e := r.recent(key, false)
	if e == nil || !e.drained() || e.renewing || now < e.dryUntil {
		return
	}
	sendAt := now
	if now >= end {
		sendAt = max(now, end+Gap)
	}
	r.start(e, now, sendAt, 1)
}

// start records a renewal of e's key in its pool (Renew: one at a time
// across the proxy, only for a pool of fewer than low units) and sends it
// at sendAt: at once, or on the tick.
func (r *Renewer) start(e *Entry, now, sendAt, low int64) {
	ok, err := r.pools.Renew(e.Key, now, sendAt+r.timeout, low)
	if err != nil {
		r.env.Warn("sluice: cannot write a shared lease: " + err.Error())
	}
	if !ok {
		return
	}
	e.renewing, e.sendAt = true, sendAt
	r.pending++
	if sendAt <= now {
		r.send(e, now)
		return
	}
	r.env.Changed(now)
}

// send sends e's renewal.
func (r *Renewer) send(e *Entry, now int64) {
	id, err := r.env.Send(e, now)
	if err != nil {
		r.env.Warn("sluice: cannot renew a lease: " + err.Error())
		r.End(e, now, false)
		return
	}
	e.InFlight, e.CallID, e.SentAt = true, id, now
}

// Tick sends the renewals due: those deferred, and those of the pools the
// worker spent from that ended Gap ago, once (an idle key is not renewed
// again); an entry whose pool ended long ago (Recent) is forgotten.
func (r *Renewer) Tick(now int64) {
	if !r.On {
		return
	}
	for i := range r.keys {
		e := &r.keys[i]
		switch {
		case !e.used, e.InFlight:
		case e.renewing:
			if now >= e.sendAt {
				r.send(e, now)
			}
		case e.spent && now-e.until >= Recent:
			e.spent = false // long gone: no lease to renew
		case e.spent && e.drained() && now >= e.until+Gap && now >= e.dryUntil && r.pending < MaxRenewals:
			e.spent = false // renewed once: an idle key is not renewed again
			r.start(e, now, now, 1)
		}
	}
}

// need returns how many units of its pool e's key is expected to use
// during two round trips of a call: 0 (no renewal) until the pool drained
// by minDrain units, then at least 1 (a renewal is sent when the last unit
// is taken, at the latest).
func (e *Entry) need(left, now, rtt int64) int64 {
	used, span := e.markLeft-left, now-e.markAt
	if used+1 < minDrain {
		return 0
	}
	if used <= 0 || span < minSpan {
		return 1
	}
	lead := 2*rtt + config.Millisecond
	return max(1, (used*lead+span-1)/span)
}

// drained reports whether the worker saw e's last pool drain by minDrain
// units: whether it is worth renewing when it ends.
func (e *Entry) drained() bool { return e.markLeft-e.left+1 >= minDrain }

// Answered records the round trip of e's renewal, answered at now.
func (r *Renewer) Answered(e *Entry, now int64) {
	r.rtt = (3*r.rtt + max(now-e.SentAt, 0)) / 4
}

// End ends e's renewal: unless it brought units (granted, which ended the
// pool's record), the pool's record ends (Answered) and the key is not
// renewed for Backoff; the worker's requests waiting for the pool wake.
func (r *Renewer) End(e *Entry, now int64, granted bool) {
	e.renewing, e.InFlight = false, false
	r.pending--
	if granted {
		e.dryUntil = 0
	} else {
		e.dryUntil = now + Backoff
		if err := r.pools.Answered(e.Key); err != nil {
			r.env.Warn("sluice: cannot write a shared lease: " + err.Error())
		}
	}
	r.env.Wake(e.Key)
	r.env.Changed(now)
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
		case e.spent && e.drained() && r.pending < MaxRenewals:
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
