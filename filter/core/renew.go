package core

import (
	"bytes"

	"github.com/sluicehq/sluice/filter/core/lease"
	"github.com/sluicehq/sluice/filter/core/rlsproto"
)

// renewals is a worker's side of the renewal of the proxy's lease pools
// (prefetch, package lease): it sends the renewals the lease.Renewer starts
// and applies their answers. It implements lease.Env.
type renewals struct {
	*env
	w   *Worker
	r   *lease.Renewer
	one sent // scratch: what a renewal asked, for the precheck
}

// newRenewals returns w's renewals over pools.
func newRenewals(w *Worker, pools lease.Pools) *renewals {
	rs := &renewals{env: &w.env, w: w}
	rs.r = lease.NewRenewer(w.cfg.LeasePrefetch, w.cfg.Timeout, pools, rs)
	return rs
}

// renewal is the handler of a renewal's call.
type renewal struct {
	rs *renewals
	e  *lease.Entry
}

// Answered takes the answer to the renewal: it implements calls.Handler.
func (c *renewal) Answered(a *rlsproto.Answer) { c.rs.answered(c.e, a) }

// Send implements lease.Env: the renewal goes out as a decision call no
// stream waits on.
func (rs *renewals) Send(e *lease.Entry, now int64) (uint32, error) {
	rs.define(mLeaseRenewals, mLeaseRenewalLost)
	o := &rs.w.out
	o.body = o.frameOf(o.body[:0], rs.asked(e))
	id, err := o.send(nil, o.body, &renewal{rs: rs, e: e}, now)
	if err == nil {
		rs.count(mLeaseRenewals)
	}
	return id, err
}

// Wake implements lease.Env: the requests waiting for key's pool (one
// descriptor) wake.
func (rs *renewals) Wake(key []byte) {
	rs.w.leases.wake(func(w *Exchange) bool { return len(w.keyEnds) == 1 && bytes.Equal(w.keys, key) })
}

// Changed implements lease.Env.
func (rs *renewals) Changed(now int64) { rs.w.schedule(now) }

// Warn implements lease.Env.
func (rs *renewals) Warn(msg string) { rs.warn(msg) }

// answered takes the answer a to e's renewal.
func (rs *renewals) answered(e *lease.Entry, a *rlsproto.Answer) {
	now := rs.host.Now()
	granted := false
	resp := &rs.w.resp
	if a.Failure == "" && rlsproto.Decode(a.Message, resp) == nil {
		rs.r.Answered(e, now)
		if len(resp.Statuses) == 1 {
			rs.w.checks.record(rs.asked(e), resp, now) // the precheck learns from it, as from any answer
			granted = rs.grant(e, resp, now)
		}
	}
	rs.r.End(e, now, granted)
}

// asked returns what e's renewal asks: its key, of cost 1.
func (rs *renewals) asked(e *lease.Entry) *sent {
	s := &rs.one
	s.keys, s.keyEnds = append(s.keys[:0], e.Key...), append(s.keyEnds[:0], len(e.Key))
	s.costs, s.sentAt = append(s.costs[:0], 1), e.SentAt
	return s
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
			// every unit until valid_until; for a window, the one the call
			// debited too
			units := int64(qt.Requests)
			if own {
				units--
				rs.spendOwn(e.Key)
			}
			ok, err := l.pools.Grant(e.Key, units, now+valid, now)
			rs.warnErr("cannot share a lease with the other workers", err)
			if !ok && err == nil {
				l.lostGrant(e.Key, now)
			}
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
