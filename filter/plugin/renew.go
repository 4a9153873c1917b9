package plugin

import (
	"bytes"

	"github.com/sluicehq/sluice/filter/core/config"
	"github.com/sluicehq/sluice/filter/core/descriptors"
	"github.com/sluicehq/sluice/filter/core/rlsproto"
	"github.com/sluicehq/sluice/filter/proxywasm/shareddata"
)

// Prefetch: the renewal of the proxy's lease pools in calls no request
// waits on (lease_prefetch, on by default). Without it, a pool is renewed
// by the call of the request that finds it empty, and that request is
// decided by the call; with it:
//
//   - a request that takes one of the last units of a pool (fewer left than
//     the pool's drain rate covers during two round trips of a call, and at
//     least the last one) sends a renewal from the root context, and goes
//     on at once;
//   - when a pool that a VM spent from ends (its valid_until: a window's
//     end, a token bucket's lease's), the VM's tick renews it renewGap
//     later, once the control plane's lease behind it has ended too (the
//     control plane ends a quota 10 ms before its lease), so that the next
//     lease's share can be granted;
//   - a request that finds its pool ended and no renewal under way starts
//     one (sent at once, or renewGap after the end), and waits for it.
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
// without a quota, admits a request of the VM that waits for the pool now,
// as that request's own call would have, or is lost
// (sluice.lease_renewal_lost): it only admits less. An OVER_LIMIT answer
// debited nothing and teaches the precheck, as any answer does.
//
// Across the proxy's VMs, one renewal (or request's call) per key is under
// way at a time: the pool's slot records it (shareddata.Leases.Renew,
// the record Ask makes), and requests that find the pool empty meanwhile
// wait for it (wait.go). A renewal that brings no units, fails or times out
// ends the record (Answered): the waiters wake and take a unit or call, as
// today; that key is then not renewed for renewBackoff.
//
// Bounds: a VM renews only the maxRecent keys it last spent from (their
// precheck key and request frame, at most about 2 × MaxKeyLen bytes each),
// never a usage-based descriptor nor one of cost other than 1, and never
// more than maxRenewals at once. An idle key is renewed at most once after
// the last lease a VM spent from: the cost of prefetch is at most one call
// (and one share left unspent) per key and lease that was spent from.
const (
	maxRecent    = 32
	maxRenewals  = 8
	renewGap     = 15 * config.Millisecond
	renewBackoff = 250 * config.Millisecond
	// renewMinSpan is the least time over which a pool's drain rate is
	// measured before it sizes the renewal's threshold (a burst of a few
	// requests says little about the rate).
	renewMinSpan = 50 * config.Millisecond
	defaultRTT   = 5 * config.Millisecond
)

// Metrics of prefetch.
const (
	// MetricLeaseRenewals counts the renewals sent.
	MetricLeaseRenewals = "sluice.lease_renewals"
	// MetricLeaseRenewalsGranted counts the renewals whose answer brought
	// units into the pool.
	MetricLeaseRenewalsGranted = "sluice.lease_renewals_granted"
	// MetricLeaseRenewalLost counts the units renewals debited and could
	// not spend (an OK answer without a quota, no request waiting).
	MetricLeaseRenewalLost = "sluice.lease_renewal_lost"
)

// recentKey is a key a VM spent a lease unit of lately.
type recentKey struct {
	// s holds the key (its one descriptor: keys, keyEnds, costs 1,
	// rateLimits) and the renewal's call (callID, sentAt), so that its
	// answer teaches the precheck as a request's does (record).
	s     stream
	frame []byte // the renewal's RateLimitRequest, in gRPC's framing
	used  bool
	// until is the end of the pool the VM last took from, and spent says
	// it took from it: renew when it ends (the tick).
	until int64
	spent bool
	took  int64 // the VM's last take
	// The pool's units left at markAt, when the VM first saw it: its drain
	// rate since.
	markLeft, markAt int64
	// renewing: the pool records this VM's renewal as under way, sent
	// (inFlight) or to be sent at sendAt.
	renewing, inFlight bool
	sendAt             int64
	dryUntil           int64 // no renewal before then: the last brought nothing
}

// renewer is a plugin instance's prefetch state.
type renewer struct {
	on                        bool
	keys                      [maxRecent]recentKey
	pending                   int // keys renewing
	calls                     map[uint32]*recentKey
	rtt                       int64 // the renewals' round trip, smoothed
	defined                   bool
	sentID, grantedID, lostID uint32
}

// configure resets r for cfg.
func (r *renewer) configure(cfg *config.Config) {
	*r = renewer{on: cfg.LeasePrefetch, rtt: defaultRTT}
	if r.on {
		r.calls = make(map[uint32]*recentKey)
	}
}

// owns reports whether callID is a renewal under way.
func (r *renewer) owns(callID uint32) bool {
	_, ok := r.calls[callID]
	return ok
}

// find returns the recent entry of key, or nil.
func (r *renewer) find(key []byte) *recentKey {
	for i := range r.keys {
		if e := &r.keys[i]; e.used && bytes.Equal(e.s.keys, key) {
			return e
		}
	}
	return nil
}

// recent returns the entry of key, made from its descriptor one (a slice
// of one) if there is none and one is given: it replaces a free entry, or
// the one spent from longest ago that is not renewing. nil when there is
// none to replace.
func (p *Plugin) recent(key []byte, one []descriptors.Descriptor) *recentKey {
	r := &p.renew
	if e := r.find(key); e != nil || one == nil {
		return e
	}
	var e *recentKey
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
	s := e.s
	s.keys = append(s.keys[:0], key...)
	s.keyEnds = append(s.keyEnds[:0], len(key))
	s.costs = append(s.costs[:0], 1)
	s.rateLimits = append(s.rateLimits[:0], one[0].RateLimit)
	*e = recentKey{s: s, used: true, frame: rlsproto.AppendRequestFrame(e.frame[:0], p.cfg.Domain, one, p.caller())}
	return e
}

// noteTake is told that the VM took a unit of key's pool, which then held
// left units until until; one is the key's descriptor when the request's
// descriptors are at hand (p.descs), else nil. It renews the pool when
// fewer units are left than its drain rate uses during two round trips.
func (p *Plugin) noteTake(key []byte, one []descriptors.Descriptor, left, until, now int64) {
	r := &p.renew
	e := p.recent(key, one)
	if e == nil {
		return
	}
	if until != e.until || left > e.markLeft || !e.spent {
		// another pool (or more units in it): measure its rate from here,
		// and renew it when it ends
		fresh := until != e.until || !e.spent
		e.until, e.markLeft, e.markAt, e.spent = until, left, now, true
		if fresh {
			p.schedule(now)
		}
	}
	e.took = now
	if e.renewing || now < e.dryUntil || r.pending >= maxRenewals || left >= e.need(left, now, r.rtt) {
		return
	}
	p.startRenewal(e, now, now, e.need(left, now, r.rtt))
}

// need returns how many units of its pool e's key is expected to use
// during two round trips of a call (at least 1: a renewal is sent when the
// last unit is taken, at the latest).
func (e *recentKey) need(left, now, rtt int64) int64 {
	used, span := e.markLeft-left, now-e.markAt
	if used <= 0 || span < renewMinSpan {
		return 1
	}
	lead := 2*rtt + config.Millisecond
	return max(1, (used*lead+span-1)/span)
}

// renewEnded is told that the request of s (one descriptor, p.descs) found
// its pool, a pool of the key, without a unit at now: it starts a renewal
// for the request to wait for, unless one cannot be made. A pool that ended
// is renewed renewGap after its end.
func (p *Plugin) renewEnded(s *stream, now int64) {
	r := &p.renew
	pool := p.quotas.pool
	if !r.on || r.pending >= maxRenewals {
		return
	}
	e := p.recent(s.key(0), p.descs.Descriptors[:1])
	if e == nil || e.renewing || now < e.dryUntil {
		return
	}
	sendAt := now
	if end := pool.TookUntil; now >= end {
		sendAt = max(now, end+renewGap)
	}
	p.startRenewal(e, now, sendAt, 1)
}

// startRenewal records a renewal of e's key in its pool (Renew: one at a
// time across the proxy, only for a pool of fewer than low units) and
// sends it at sendAt: at once, or on the tick.
func (p *Plugin) startRenewal(e *recentKey, now, sendAt, low int64) {
	ok, err := p.quotas.pool.Renew(e.s.key(0), now, sendAt+p.cfg.Timeout, low)
	if err != nil {
		p.warn("sluice: cannot write a shared lease: " + err.Error())
	}
	if !ok {
		return
	}
	e.renewing, e.sendAt = true, sendAt
	p.renew.pending++
	if sendAt <= now {
		p.sendRenewal(e, now)
		return
	}
	p.schedule(now)
}

// sendRenewal sends e's renewal.
func (p *Plugin) sendRenewal(e *recentKey, now int64) {
	r := &p.renew
	p.defineRenewMetrics()
	callID, err := p.send(e.frame)
	if err != nil {
		p.warn("sluice: cannot renew a lease (cluster " + p.cfg.Cluster + "): " + err.Error())
		p.endRenewal(e, now, false)
		return
	}
	e.inFlight, e.s.callID, e.s.sentAt = true, callID, now
	r.calls[callID] = e
	p.count(r.sentID)
}

// renewTick sends the renewals due: those deferred, and those of the pools
// the VM spent from that ended renewGap ago; it gives up on renewals the
// proxy never answered.
func (p *Plugin) renewTick(now int64) {
	r := &p.renew
	if !r.on || p.cfg == nil || p.quotas.pool == nil {
		return
	}
	limit := p.cfg.Timeout + overdueGrace
	for i := range r.keys {
		e := &r.keys[i]
		switch {
		case !e.used:
		case e.inFlight:
			if now-e.s.sentAt > limit {
				delete(r.calls, e.s.callID)
				p.endRenewal(e, now, false)
			}
		case e.renewing:
			if now >= e.sendAt {
				p.sendRenewal(e, now)
			}
		case e.spent && now-e.until >= shareddata.Recent:
			e.spent = false // long gone: no lease to renew
		case e.spent && now >= e.until+renewGap && now >= e.dryUntil && r.pending < maxRenewals:
			e.spent = false // renewed once: an idle key is not renewed again
			p.startRenewal(e, now, now, 1)
		}
	}
}

// renewDue returns when the renewer next has something to do on the tick.
func (r *renewer) renewDue(timeout int64) (due int64, ok bool) {
	if !r.on {
		return 0, false
	}
	for i := range r.keys {
		e := &r.keys[i]
		var t int64
		switch {
		case !e.used:
			continue
		case e.inFlight:
			t = e.s.sentAt + timeout + overdueGrace + 1
		case e.renewing:
			t = e.sendAt
		case e.spent && r.pending < maxRenewals:
			t = max(e.until+renewGap, e.dryUntil)
		default:
			continue
		}
		if !ok || t < due {
			due, ok = t, true
		}
	}
	return due, ok
}

// onRenewal takes the answer to renewal callID: reason says why it is
// unusable, or "" when p.resp holds it.
func (p *Plugin) onRenewal(callID uint32, reason string) {
	r := &p.renew
	e := r.calls[callID]
	delete(r.calls, callID)
	now := p.host.Now()
	granted := false
	if reason == "" {
		r.rtt = (3*r.rtt + max(now-e.s.sentAt, 0)) / 4
		if len(p.resp.Statuses) == 1 {
			p.record(&e.s, now) // the precheck learns from it, as from any answer
			granted = p.grantRenewal(e, now)
		}
	}
	p.endRenewal(e, now, granted)
}

// grantRenewal puts the units of the renewal answer in p.resp into e's
// pool and reports whether it did.
func (p *Plugin) grantRenewal(e *recentKey, now int64) bool {
	resp := &p.resp
	st := &resp.Statuses[0]
	if resp.OverallCode != rlsproto.CodeOK || st.Code != rlsproto.CodeOK {
		return false // refused: nothing was debited
	}
	q := &p.quotas
	own := !windowed(resp) // the unit this call debited may not wait in the pool
	if qt := &st.Quota; qt.Requests >= 1 && qt.ValidUntil != 0 && (!own || qt.Requests >= 2) {
		if valid := qt.ValidUntil - p.wallNow(); valid > 0 {
			if !q.seen {
				q.seen = true
				if err := q.pool.Announce(); err != nil {
					p.warn("sluice: cannot tell the other VMs about leases: " + err.Error())
				}
			}
			// every unit until valid_until; for a window, the one the
			// call debited too
			units := int64(qt.Requests)
			if own {
				units--
				p.spendOwn(e.s.keys)
			}
			ok, err := q.pool.Grant(e.s.key(0), units, now+valid, now)
			if err != nil {
				p.warn("sluice: cannot share a lease with the other VMs: " + err.Error())
			}
			p.reportLeases()
			if ok {
				p.count(p.renew.grantedID)
				e.dryUntil = 0
				return true
			}
			return false // lost, and counted (sluice.lease_lost)
		}
	}
	// Admitted without a quota: the unit it debited admits a request
	// waiting for the pool now, as that request's own call would have.
	p.spendOwn(e.s.keys)
	return false
}

// spendOwn spends the unit a renewal of key debited now: it admits a
// request of the VM that waits for the pool, or is lost (counted).
func (p *Plugin) spendOwn(key []byte) {
	if !p.admitWaiter(key) {
		p.count(p.renew.lostID)
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

// admitWaiter admits the first request of the VM that waits for the pool
// of key (one descriptor) as if the control plane had answered its call,
// and reports whether there was one.
func (p *Plugin) admitWaiter(key []byte) bool {
	for i, w := range p.waiting {
		if len(w.keyEnds) != 1 || !bytes.Equal(w.keys, key) {
			continue
		}
		copy(p.waiting[i:], p.waiting[i+1:])
		p.waiting[len(p.waiting)-1] = nil
		p.waiting = p.waiting[:len(p.waiting)-1]
		w.state, w.remote = stateDone, false
		if err := p.host.SetEffectiveContext(w.id); err != nil {
			continue // gone: the next one
		}
		p.count(p.metrics.allowed)
		p.resume(w)
		return true
	}
	return false
}

// endRenewal ends e's renewal: unless it brought units (which ended the
// pool's record), the pool's record ends (Answered) and the key is not
// renewed for renewBackoff; the requests of the VM waiting for the pool
// wake.
func (p *Plugin) endRenewal(e *recentKey, now int64, granted bool) {
	r := &p.renew
	e.renewing, e.inFlight = false, false
	r.pending--
	if !granted {
		e.dryUntil = now + renewBackoff
		if err := p.quotas.pool.Answered(e.s.key(0)); err != nil {
			p.warn("sluice: cannot write a shared lease: " + err.Error())
		}
	}
	key := e.s.keys
	p.wake(func(w *stream) bool { return len(w.keyEnds) == 1 && bytes.Equal(w.keys, key) })
	p.schedule(now)
}

// defineRenewMetrics defines the prefetch metrics, once.
func (p *Plugin) defineRenewMetrics() {
	r := &p.renew
	if r.defined {
		return
	}
	r.sentID = p.defineCounter(MetricLeaseRenewals)
	r.grantedID = p.defineCounter(MetricLeaseRenewalsGranted)
	r.lostID = p.defineCounter(MetricLeaseRenewalLost)
	r.defined = true
}
