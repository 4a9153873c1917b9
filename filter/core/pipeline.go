package core

import (
	"github.com/sluicehq/sluice/filter/core/descriptors"
	"github.com/sluicehq/sluice/filter/core/rlsproto"
)

// RequestHeaders decides x's request, top to bottom through the stages of
// the request path (see the package's documentation): a local 429, a call
// to the control plane (Pause), a wait for another call (Pause), or
// through (Continue). It does not recover from a panic: its host does,
// and calls Recover.
//
// The descriptors are built one at a time and each is prechecked as soon
// as it is built: the precheck decides each on its own, in order, so a
// request rejected on one needs none of the header reads of the later ones
// (each a host call). The clock is read once, when the first descriptor is
// checked (or before the call when the precheck is off); that time is also
// the call's sentAt, which may be earlier than the send, never later, as
// the precheck's bounds need.
func (w *Worker) RequestHeaders(x *Exchange) Action {
	if w.cfg == nil || x.state != stateIdle {
		return Continue
	}
	x.state = stateDone
	rls := w.cfg.RateLimits
	descs := &w.descs
	descs.Reset()
	var now int64
	haveNow := false
	for i := range rls {
		// 1. descriptors
		if !descs.Add(&rls[i], i, x.req) {
			continue
		}
		d := &descs.Descriptors[len(descs.Descriptors)-1]
		if d.Usage {
			w.usage.requestCost(x, d)
		}
		start := len(x.keys)
		x.keys = descriptors.AppendKey(x.keys, d)
		x.keyEnds = append(x.keyEnds, len(x.keys))
		// 2. precheck
		if !w.checks.on {
			continue
		}
		if !haveNow {
			now, haveNow = w.host.Now(), true
		}
		if v := w.checks.table.Check(x.keys[start:], d.PrecheckCost(), now); v.Reject && !w.leases.covers(x.keys[start:], d, now) {
			return w.checks.reject(x, &w.replies, d.RateLimit, v)
		}
	}
	if len(descs.Descriptors) == 0 {
		return Continue
	}
	if !haveNow {
		now = w.host.Now()
	}
	// 3. lease pool, 4. wait for a call under way
	if w.leases.spend(x, descs.Descriptors, now) {
		return Continue
	}
	if w.leases.wait(x, descs.Descriptors, now) {
		return Pause
	}
	// 5. shared blocks
	if w.checks.blocks != nil {
		if action, rejected := w.checkShared(x, descs.Descriptors, now); rejected {
			return action
		}
	}
	// 6. call
	return w.callOut(x, now)
}

// callOut asks the control plane about the descriptors in w.descs (their
// precheck keys are in x.keys) and pauses the request until the answer.
// It is apart from RequestHeaders, which it would slow down: in
// filter.wasm, the more code and variables a function has, the more each
// of its branches costs.
func (w *Worker) callOut(x *Exchange, now int64) Action {
	descs := w.descs.Descriptors
	for i := range descs {
		x.costs = append(x.costs, int64(descs[i].HitsAddend))
		x.rateLimits = append(x.rateLimits, descs[i].RateLimit)
	}
	o := &w.out
	o.body = rlsproto.AppendRequestFrame(o.body[:0], w.cfg.Domain, descs, o.caller)
	id, err := w.send(x.stream, o.body, x, now)
	if err != nil {
		w.leases.called(x) // nobody waits for a call that was not made
		// (a usage-based request failed open settles its whole usage)
		return w.fail(x, "cannot call the control plane (cluster "+w.cfg.Cluster+"): "+err.Error(), false)
	}
	x.state, x.callID, x.sentAt = statePending, id, now
	w.leases.ask(x)
	return Pause
}
