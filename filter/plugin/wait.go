package plugin

import (
	"bytes"
	"strconv"

	"github.com/sluicehq/sluice/filter/rlsproto"
)

// Waiting for a call under way. When the proxy's lease pool of a descriptor
// runs out or ends (every window's first requests, most often), the
// requests that arrive before the first call's answer would each call too,
// though that answer most likely brings a quota that covers them. So a
// request whose pool is empty, while a call of this VM for the same
// descriptors is under way, waits for that call's answer instead (state
// stateWaiting): then it takes a unit of the pool, or, if there is none,
// makes its own call, which the next waiters wait for in turn. A request
// waits only:
//   - for descriptors of cost 1 that the proxy holds a lease pool for
//     (sharedblocks.Leases.Holds): a limit without leases never waits;
//   - while fewer than maxWaiting requests of the plugin wait;
//   - for a call of its own VM (another VM's answer would need a wake-up
//     across VMs).
//
// A waiting request was decided by nobody yet: it is admitted from a
// quota, which the control plane debited in advance, or by its own call,
// so waiting changes no decision, only which requests call. Its wait is
// bounded by the call's timeout: a call that ends in any way (answer,
// failure, given up on the tick) wakes its waiters, and the tick wakes a
// waiter whose call is no longer under way or that has waited longer than
// the timeout and the grace period.
const maxWaiting = 256

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
	descs := p.descs.Descriptors
	for i := range descs {
		if descs[i].HitsAddend != 1 || !q.pool.Holds(s.key(i)) {
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
	if len(p.asking) == 0 {
		return
	}
	if p.asking[string(s.keys)] != s {
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
	p.wake(func(w *stream) bool {
		c := p.asking[string(w.keys)]
		return c == nil || c.state != statePending || now-w.sentAt > limit
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
		if c := p.asking[string(w.keys)]; c != nil && c.state == statePending && now-w.sentAt <= p.cfg.Timeout+overdueGrace {
			kept = append(kept, w) // a waiter woken before it called: wait for that call
			continue
		}
		p.resumeWaiting(w, now)
	}
	clear(p.waiting[len(kept):])
	p.waiting = kept
}

// resumeWaiting admits w from its pool, or calls for it.
func (p *Plugin) resumeWaiting(w *stream, now int64) {
	w.state = stateDone
	if p.cfg == nil || p.calls == nil {
		return // the plugin instance is going away
	}
	if err := p.host.SetEffectiveContext(w.id); err != nil {
		p.warn("sluice: stream " + strconv.FormatUint(uint64(w.id), 10) + " is gone: " + err.Error())
		return
	}
	if p.takeQuota(w, len(w.costs), now) {
		if err := p.host.ResumeRequest(); err != nil {
			p.warn("sluice: cannot resume the request: " + err.Error())
		}
		return
	}
	callID, err := p.host.HTTPCall(p.cfg.Cluster, p.headers, w.frame, p.timeout)
	if err != nil {
		p.fail(w, "cannot call the control plane (cluster "+p.cfg.Cluster+"): "+err.Error(), true)
		return
	}
	w.state, w.callID, w.sentAt = statePending, callID, now
	p.calls[callID] = w
	p.ask(w)
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
