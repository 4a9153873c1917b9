package core

import (
	"bytes"

	"github.com/sluicehq/sluice/filter/core/descriptors"
	"github.com/sluicehq/sluice/filter/core/lease"
	"github.com/sluicehq/sluice/filter/core/rlsproto"
)

// renewals renews the proxy's lease pools before they run out (prefetch,
// see package lease): the lease.Renewer says when, and renewals makes the
// calls and applies their answers.
type renewals struct {
	*env
	w   *Worker
	r   lease.Renewer
	one sent // scratch: what a renewal asked, for the precheck
}

// newRenewals returns w's renewals, kept by r.
func newRenewals(w *Worker, r lease.Renewer) *renewals { return &renewals{env: &w.env, w: w, r: r} }

// renewal is the handler of a renewal's call.
type renewal struct {
	rs *renewals
	e  *lease.Entry
}

// Answered takes the answer to the renewal: it implements calls.Handler.
func (c *renewal) Answered(a *rlsproto.Answer) { c.rs.answered(c.e, a) }

// noteTake is told that the worker took a unit of key's pool, which then
// held left units until until; one is the key's descriptor when the
// request's descriptors are at hand, else nil. It renews the pool when
// fewer units are left than its drain rate uses during two round trips.
func (rs *renewals) noteTake(key []byte, one []descriptors.Descriptor, left, until, now int64) {
	e := rs.r.Recent(key, one)
	if e == nil {
		return
	}
	fresh, low := rs.r.Took(e, left, until, now)
	if fresh {
		rs.w.schedule(now) // its end is due
	}
	if low > 0 {
		rs.start(e, now, now, low)
	}
}

// renewEnded is told that a request (of one descriptor, one, whose key is
// key) found its pool, which ended at end, without a unit at now: it
// starts a renewal for the request to wait for, unless one cannot be made.
// A pool that ended is renewed lease.Gap after its end.
func (rs *renewals) renewEnded(key []byte, one []descriptors.Descriptor, end, now int64) {
	if !rs.r.On || rs.r.Full() {
		return
	}
	e := rs.r.Recent(key, one)
	if !rs.r.MayRenew(e, now) {
		return
	}
	sendAt := now
	if now >= end {
		sendAt = max(now, end+lease.Gap)
	}
	rs.start(e, now, sendAt, 1)
}

// start records a renewal of e's key in its pool (Renew: one at a time
// across the proxy, only for a pool of fewer than low units) and sends it
// at sendAt: at once, or on the tick.
func (rs *renewals) start(e *lease.Entry, now, sendAt, low int64) {
	ok, err := rs.w.leases.pools.Renew(e.Key, now, sendAt+rs.cfg.Timeout, low)
	rs.warnErr("cannot write a shared lease", err)
	if !ok {
		return
	}
	rs.r.Started(e, sendAt)
	if sendAt <= now {
		rs.send(e, now)
		return
	}
	rs.w.schedule(now)
}

// send sends e's renewal.
func (rs *renewals) send(e *lease.Entry, now int64) {
	rs.define(mLeaseRenewals, mLeaseRenewalLost)
	id, err := rs.w.send(nil, e.Frame, &renewal{rs: rs, e: e}, now)
	if err != nil {
		rs.warn("sluice: cannot renew a lease (cluster " + rs.cfg.Cluster + "): " + err.Error())
		rs.end(e, now, false)
		return
	}
	rs.r.Sent(e, id, now)
	rs.count(mLeaseRenewals)
}

// tick sends the renewals due: those deferred, and those of the pools the
// worker spent from that ended lease.Gap ago.
func (rs *renewals) tick(now int64) {
	if !rs.r.On {
		return
	}
	for e, what, i := rs.r.Due(0, now); e != nil; e, what, i = rs.r.Due(i, now) {
		if what == lease.SendNow {
			rs.send(e, now)
		} else {
			rs.start(e, now, now, 1)
		}
	}
}

// answered takes the answer a to e's renewal.
func (rs *renewals) answered(e *lease.Entry, a *rlsproto.Answer) {
	now := rs.host.Now()
	granted := false
	resp := &rs.w.resp
	if a.Failure == "" && rlsproto.Decode(a.Message, resp) == nil {
		rs.r.Answered(e, now)
		if len(resp.Statuses) == 1 {
			s := &rs.one
			s.keys, s.keyEnds = append(s.keys[:0], e.Key...), append(s.keyEnds[:0], len(e.Key))
			s.costs, s.rateLimits, s.sentAt = append(s.costs[:0], 1), append(s.rateLimits[:0], e.RateLimit), e.SentAt
			rs.w.checks.record(s, resp, now) // the precheck learns from it, as from any answer
			granted = rs.grant(e, resp, now)
		}
	}
	rs.end(e, now, granted)
}

// grant puts the units of the renewal answer resp into e's pool and
// reports whether it did.
func (rs *renewals) grant(e *lease.Entry, resp *rlsproto.Response, now int64) bool {
	st := &resp.Statuses[0]
	if resp.OverallCode != rlsproto.CodeOK || st.Code != rlsproto.CodeOK {
		return false // refused: nothing was debited
	}
	l := &rs.w.leases
	own := !windowed(resp) // the unit this call debited may not wait in the pool
	if qt := &st.Quota; qt.Requests >= 1 && qt.ValidUntil != 0 && (!own || qt.Requests >= 2) {
		if valid := qt.ValidUntil - rs.host.WallNow(); valid > 0 {
			l.announce()
			// every unit until valid_until; for a window, the one the call
			// debited too
			units := int64(qt.Requests)
			if own {
				units--
				rs.spendOwn(e.Key)
			}
			ok, err := l.pools.Grant(e.Key, units, now+valid, now)
			rs.warnErr("cannot share a lease with the other workers", err)
			l.report()
			if ok {
				rs.count(mLeaseRenewalsGranted)
			}
			return ok // (lost, and counted in sluice.lease_lost, when not)
		}
	}
	// Admitted without a quota: the unit it debited admits a request
	// waiting for the pool now, as that request's own call would have.
	rs.spendOwn(e.Key)
	return false
}

// spendOwn spends the unit a renewal of key debited now: it admits a
// request of the worker that waits for the pool, or is lost (counted).
func (rs *renewals) spendOwn(key []byte) {
	if !rs.w.leases.admitWaiter(key) {
		rs.count(mLeaseRenewalLost)
	}
}

// windowed reports whether the answer's one limit is a window
// (fixed_window, sliding_window): a unit it debited may be spent until the
// quota's valid_until, which ends with the window.
func windowed(resp *rlsproto.Response) bool {
	if !resp.HasLimits || len(resp.Limits) != 1 {
		return false
	}
	a := resp.Limits[0].Algorithm
	return a == rlsproto.AlgorithmFixedWindow || a == rlsproto.AlgorithmSlidingWindow
}

// end ends e's renewal: unless it brought units (which ended the pool's
// record), the pool's record ends (Answered) and the key is not renewed
// for lease.Backoff; the requests of the worker waiting for the pool wake.
func (rs *renewals) end(e *lease.Entry, now int64, granted bool) {
	rs.r.Ended(e, now, granted)
	l := &rs.w.leases
	if !granted {
		rs.warnErr("cannot write a shared lease", l.pools.Answered(e.Key))
	}
	key := e.Key
	l.wake(func(w *Exchange) bool { return len(w.keyEnds) == 1 && bytes.Equal(w.keys, key) })
	rs.w.schedule(now)
}
