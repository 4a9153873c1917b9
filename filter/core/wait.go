package core

import (
	"bytes"

	"github.com/sluicehq/sluice/filter/core/descriptors"
)

// Waiting for a call under way. When the proxy's lease pool of a descriptor
// runs out or ends (every window's first requests, most often), the
// requests that arrive before the first call's answer would each call too,
// though that answer most likely brings a quota that covers them. So a
// request whose pool is empty, while a call of this worker for the same
// descriptors is under way, waits for that call's answer instead (state
// stateWaiting): then it takes a unit of the pool, or, if there is none,
// makes its own call (it does not wait twice). A request waits only:
//   - for descriptors of cost 1 that the proxy holds a lease pool for,
//     granted within the last second (lease.Pools.Holds): a limit without
//     leases, or one the control plane stopped sharing (at its limit),
//     never waits;
//   - while fewer than maxWaiting requests of the worker wait.
//
// The call may be another worker's (one descriptor): the pool records the
// call under way (lease.Pools.Ask) until the call's timeout, its grant, or
// its Answered. Nothing wakes a worker from another, so while requests
// wait for another worker's call the tick runs every waitTick and looks at
// the pool.
//
// A waiting request was decided by nobody yet: it is admitted from a
// quota, which the control plane debited in advance, or by its own call,
// so waiting changes no decision, only which requests call. Its wait is
// bounded by the call's timeout: a call that ends in any way (answer,
// failure, given up on) wakes its waiters, and the tick wakes a waiter
// whose call is no longer under way or that has waited longer than the
// timeout and the grace period.
const (
	maxWaiting = 256
	waitTick   = 1_000_000 // ns
)

// awaitCall makes x (the request of descs) wait for a call under way for
// the same descriptors and reports whether it does: its worker's own call
// (waitForCall), or another worker's (waitForOther). The request remembers
// what its own call would ask, should it make one when it wakes.
func (l *leaser) awaitCall(x *Exchange, descs []descriptors.Descriptor, now int64) bool {
	if !l.seen {
		return false
	}
	remote := false
	switch {
	case l.waitForCall(x, descs, now):
	case l.waitForOther(x, descs, now):
		remote = true
	default:
		return false
	}
	for i := range descs {
		x.costs = append(x.costs, 1)
		x.rateLimits = append(x.rateLimits, descs[i].RateLimit)
	}
	x.state, x.sentAt, x.remote = stateWaiting, now, remote
	l.waiting = append(l.waiting, x)
	l.define(mQuotaAllowed, mLeaseWaited)
	l.count(mLeaseWaited)
	if remote {
		l.w.schedule(now)
	}
	return true
}

// ask records that x's call is under way for its descriptors, unless
// another one is: requests that find their pool empty wait for it. Only
// when the pool x's request found without a unit is its key's (recent):
// for a key that holds no pool no request waits, and the record would only
// cost (leases that cannot help cost nothing).
func (l *leaser) ask(x *Exchange) {
	if !l.took.Recent {
		return
	}
	if l.asking == nil {
		l.asking = make(map[string]*Exchange)
	}
	if c := l.asking[string(x.keys)]; c == nil || c.state != statePending {
		l.asking[string(x.keys)] = x
	}
}

// waitForCall reports whether x may wait for its worker's call under way
// for the same descriptors.
func (l *leaser) waitForCall(x *Exchange, descs []descriptors.Descriptor, now int64) bool {
	if len(l.waiting) >= maxWaiting || len(l.asking) == 0 {
		return false
	}
	if c := l.asking[string(x.keys)]; c == nil || c.state != statePending {
		return false
	}
	if !l.took.Recent {
		// The descriptor spend found without a unit has no recent lease:
		// its call will bring none to wait for (no read needed).
		return false
	}
	for i := range descs {
		if descs[i].HitsAddend != 1 || descs[i].Usage || !l.pools.Holds(x.key(i), now) {
			return false
		}
	}
	return true
}

// waitForOther reports whether x (one descriptor) may wait for another
// worker's call under way for it; otherwise the pool records that x's
// call is the one under way (Ask), if the proxy holds a pool for the
// descriptor.
func (l *leaser) waitForOther(x *Exchange, descs []descriptors.Descriptor, now int64) bool {
	if len(descs) != 1 || descs[0].HitsAddend != 1 || descs[0].Usage {
		return false
	}
	if !l.took.Recent {
		return false // spend's Take just read the pool: no lease of the key to wait for
	}
	wait, err := l.pools.Ask(x.key(0), now, now+l.cfg.Timeout)
	l.warnErr("cannot read a shared lease", err)
	if !wait {
		x.asked = true
		return false
	}
	return len(l.waiting) < maxWaiting
}

// waitsRemote reports whether a request waits for another worker's call.
func (l *leaser) waitsRemote() bool {
	for _, w := range l.waiting {
		if w.remote {
			return true
		}
	}
	return false
}

// called is told that x's call ended (its answer applied, or given up on):
// it wakes the requests that waited for it.
func (l *leaser) called(x *Exchange) {
	l.unask(x)
	if len(l.asking) == 0 || l.asking[string(x.keys)] != x {
		return
	}
	delete(l.asking, string(x.keys))
	l.wake(func(w *Exchange) bool { return bytes.Equal(w.keys, x.keys) })
}

// unask ends the record of x's call in its pool (Ask), if there is one: a
// grant ended it already, else the other workers' waiters must not wait
// for a grant that is not coming.
func (l *leaser) unask(x *Exchange) {
	if !x.asked {
		return
	}
	x.asked = false
	if len(x.keyEnds) == 1 {
		l.warnErr("cannot write a shared lease", l.pools.Answered(x.key(0)))
	}
}

// wakeStale wakes the waiters whose call is no longer under way (a call
// that ended without telling, after a panic) or that waited past the call
// timeout and grace: on the tick.
func (l *leaser) wakeStale(now int64) {
	if len(l.waiting) == 0 {
		return
	}
	limit := l.cfg.Timeout + overdueGrace
	l.wake(func(w *Exchange) bool {
		if now-w.sentAt > limit {
			return true
		}
		if w.remote { // another worker's call: its grant, its end
			return l.pools.Covers(w.key(0), now) || !l.pools.Asking(w.key(0), now)
		}
		c := l.asking[string(w.keys)]
		return c == nil || c.state != statePending
	})
}

// wake resumes the waiters that match: each takes a unit of its pool or
// calls; once one has called, the later ones with the same descriptors
// wait for that call.
func (l *leaser) wake(match func(w *Exchange) bool) {
	if len(l.waiting) == 0 {
		return
	}
	now := l.host.Now()
	kept := l.waiting[:0]
	for _, w := range l.waiting {
		if !match(w) {
			kept = append(kept, w)
			continue
		}
		l.resumeWaiting(w, now)
	}
	clear(l.waiting[len(kept):])
	l.waiting = kept
}

// resumeWaiting admits w from its pool, or calls for it: the call it
// waited for brought it nothing, so it does not wait again (at the limit,
// a chain of waits would make each request wait for all before it).
func (l *leaser) resumeWaiting(w *Exchange, now int64) {
	w.state, w.remote = stateDone, false
	if l.cfg == nil {
		return // the configuration is going away
	}
	if l.take(w, len(w.costs), false, now) {
		l.w.resume(w)
		return
	}
	o := &l.w.out
	o.body = o.frameOf(o.body[:0], &w.sent)
	id, err := o.send(w.stream, o.body, w, now)
	if err != nil {
		l.w.fail(w, "cannot call the control plane (cluster "+l.cfg.Cluster+"): "+err.Error(), true)
		return
	}
	w.state, w.callID, w.sentAt = statePending, id, now
}

// unwait stops x's wait: its stream ended.
func (l *leaser) unwait(x *Exchange) {
	for i, s := range l.waiting {
		if s == x {
			l.waiting = removeAt(l.waiting, i)
			break
		}
	}
	x.state = stateDone
}

// admitWaiter admits the first request of the worker that waits for the
// pool of key (one descriptor) as if the control plane had answered its
// call, and reports whether there was one.
func (l *leaser) admitWaiter(key []byte) bool {
	for i, w := range l.waiting {
		if len(w.keyEnds) != 1 || !bytes.Equal(w.keys, key) {
			continue
		}
		l.waiting = removeAt(l.waiting, i)
		w.state, w.remote = stateDone, false
		if w.closed {
			continue // gone: the next one
		}
		l.count(mAllowed)
		l.w.resume(w)
		return true
	}
	return false
}
