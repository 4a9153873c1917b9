package plugin

import (
	"bytes"
	"strconv"

	"github.com/sluicehq/sluice/filter/core/rlsproto"
)

// Waiting for a call under way. When the proxy's lease pool of a descriptor
// runs out or ends (every window's first requests, most often), the
// requests that arrive before the first call's answer would each call too,
// though that answer most likely brings a quota that covers them. So a
// request whose pool is empty, while a call of this VM for the same
// descriptors is under way, waits for that call's answer instead (state
// stateWaiting): then it takes a unit of the pool, or, if there is none,
// makes its own call (it does not wait twice). A request waits only:
//   - for descriptors of cost 1 that the proxy holds a lease pool for,
//     granted within the last second (shareddata.Leases.Holds): a limit
//     without leases, or one the control plane stopped sharing (at its
//     limit), never waits;
//   - while fewer than maxWaiting requests of the plugin wait.
//
// The call may be another VM's (one descriptor): the pool's slot records
// the call under way (shareddata.Leases.Ask) until the call's timeout,
// its grant, or its Answered. Nothing wakes a VM from another, so while
// requests wait for another VM's call the tick runs every waitTickMs and
// looks at the pool.
//
// A waiting request was decided by nobody yet: it is admitted from a
// quota, which the control plane debited in advance, or by its own call,
// so waiting changes no decision, only which requests call. Its wait is
// bounded by the call's timeout: a call that ends in any way (answer,
// failure, given up on the tick) wakes its waiters, and the tick wakes a
// waiter whose call is no longer under way or that has waited longer than
// the timeout and the grace period.
const (
	maxWaiting = 256
	waitTickMs = 1
)

// waitForCall makes s wait for a call under way for the same descriptors
// (p.descs) and reports whether it does.
func (p *Plugin) waitForCall(s *stream, now int64) bool {
	q := &p.quotas
	if !q.seen || len(p.waiting) >= maxWaiting || len(p.asking) == 0 {
		return false
	}
	if c := p.asking[string(s.keys)]; c == nil || c.state != statePending {
		return false
	}
	if !q.pool.TookRecent() {
		// The descriptor spendQuota found without a unit has no recent
		// lease: its call will bring none to wait for (no read needed).
		return false
	}
	descs := p.descs.Descriptors
	for i := range descs {
		if descs[i].HitsAddend != 1 || descs[i].Usage || !q.pool.Holds(s.key(i), now) {
			return false
		}
	}
	s.frame = rlsproto.AppendRequestFrame(s.frame[:0], p.cfg.Domain, descs, p.caller())
	for i := range descs {
		s.costs = append(s.costs, 1)
		s.rateLimits = append(s.rateLimits, descs[i].RateLimit)
	}
	s.state, s.sentAt = stateWaiting, now
	p.waiting = append(p.waiting, s)
	p.defineQuotaMetrics()
	p.count(q.waitedID)
	return true
}

// waitForOther makes s (one descriptor, p.descs) wait for another VM's
// call under way for it, and reports whether it does; otherwise the pool
// records that s's call is the one under way (Ask), if the proxy holds a
// pool for the descriptor.
func (p *Plugin) waitForOther(s *stream, now int64) bool {
	q := &p.quotas
	descs := p.descs.Descriptors
	if !q.seen || len(descs) != 1 || descs[0].HitsAddend != 1 || descs[0].Usage || p.cfg == nil {
		return false
	}
	if !q.pool.TookRecent() {
		return false // spendQuota's Take just read the slot: no lease of the key to wait for
	}
	p.renewEnded(s, now) // a renewal, if one can be made, is the call to wait for
	wait, err := q.pool.Ask(s.key(0), now, now+p.cfg.Timeout)
	if err != nil {
		p.warn("sluice: cannot read a shared lease: " + err.Error())
	}
	if !wait {
		s.asked = true
		return false
	}
	if len(p.waiting) >= maxWaiting {
		return false
	}
	s.frame = rlsproto.AppendRequestFrame(s.frame[:0], p.cfg.Domain, descs, p.caller())
	s.costs = append(s.costs, 1)
	s.rateLimits = append(s.rateLimits, descs[0].RateLimit)
	s.state, s.sentAt, s.remote = stateWaiting, now, true
	p.waiting = append(p.waiting, s)
	p.defineQuotaMetrics()
	p.count(q.waitedID)
	p.schedule(now)
	return true
}

// waitsRemote reports whether a request waits for another VM's call.
func (p *Plugin) waitsRemote() bool {
	for _, w := range p.waiting {
		if w.remote {
			return true
		}
	}
	return false
}

// ask records that s's call is under way for its descriptors, unless
// another one is: requests that find their pool empty wait for it. Only
// once leases are in use.
func (p *Plugin) ask(s *stream) {
	if !p.quotas.seen {
		return
	}
	if p.asking == nil {
		p.asking = make(map[string]*stream)
	}
	if c := p.asking[string(s.keys)]; c == nil || c.state != statePending {
		p.asking[string(s.keys)] = s
	}
}

// called is told that s's call ended (its answer applied, or given up on):
// it wakes the requests that waited for it.
func (p *Plugin) called(s *stream) {
	if s.asked {
		// A grant ended the ask already; else the other VMs' waiters
		// must not wait for a grant that is not coming.
		s.asked = false
		if p.quotas.pool != nil && len(s.keyEnds) == 1 {
			if err := p.quotas.pool.Answered(s.key(0)); err != nil {
				p.warn("sluice: cannot write a shared lease: " + err.Error())
			}
		}
	}
	if len(p.asking) == 0 || p.asking[string(s.keys)] != s {
		return
	}
	delete(p.asking, string(s.keys))
	p.wake(func(w *stream) bool { return bytes.Equal(w.keys, s.keys) })
}

// wakeStale wakes the waiters whose call is no longer under way (a call
// that ended without telling, after a panic) or that waited past the call
// timeout and grace: on the tick.
func (p *Plugin) wakeStale(now int64) {
	if len(p.waiting) == 0 || p.cfg == nil {
		return
	}
	limit := p.cfg.Timeout + overdueGrace
	pool := p.quotas.pool
	p.wake(func(w *stream) bool {
		if now-w.sentAt > limit {
			return true
		}
		if w.remote { // another VM's call: its grant, its end
			return pool.Covers(w.key(0), now) || !pool.Asking(w.key(0), now)
		}
		c := p.asking[string(w.keys)]
		return c == nil || c.state != statePending
	})
}

// wake resumes the waiters that match: each takes a unit of its pool or
// calls; once one has called, the later ones with the same descriptors
// wait for that call.
func (p *Plugin) wake(match func(w *stream) bool) {
	now := p.host.Now()
	kept := p.waiting[:0]
	for _, w := range p.waiting {
		if !match(w) {
			kept = append(kept, w)
			continue
		}
		p.resumeWaiting(w, now)
	}
	clear(p.waiting[len(kept):])
	p.waiting = kept
}

// resumeWaiting admits w from its pool, or calls for it: the call it
// waited for brought it nothing, so it does not wait again (at the limit,
// a chain of waits would make each request wait for all before it).
func (p *Plugin) resumeWaiting(w *stream, now int64) {
	w.state, w.remote = stateDone, false
	if p.cfg == nil || p.calls == nil {
		return // the plugin instance is going away
	}
	if err := p.host.SetEffectiveContext(w.id); err != nil {
		p.warn("sluice: stream " + strconv.FormatUint(uint64(w.id), 10) + " is gone: " + err.Error())
		return
	}
	if p.takeQuota(w, len(w.costs), now, false) {
		if err := p.host.ResumeRequest(); err != nil {
			p.warn("sluice: cannot resume the request: " + err.Error())
		}
		return
	}
	callID, err := p.send(w.frame)
	if err != nil {
		p.fail(w, "cannot call the control plane (cluster "+p.cfg.Cluster+"): "+err.Error(), true)
		return
	}
	w.state, w.callID, w.sentAt = statePending, callID, now
	p.calls[callID] = w
}

// unwait stops w's wait: its stream ended.
func (p *Plugin) unwait(w *stream) {
	for i, s := range p.waiting {
		if s == w {
			copy(p.waiting[i:], p.waiting[i+1:])
			p.waiting[len(p.waiting)-1] = nil
			p.waiting = p.waiting[:len(p.waiting)-1]
			break
		}
	}
	w.state = stateDone
}
