package core

import "github.com/sluicehq/sluice/filter/core/descriptors"

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
	if w.tokens.readsBody && !x.sized && w.tokens.awaitBody(x) {
		return Pause // decided once its body is read (tokens.go)
	}
	x.state = stateDone
	rls := w.cfg.RateLimits
	descs := &w.descs
	descs.Reset()
	descs.Reserves = nil
	if x.sized {
		descs.Reserves = x.reserves
	}
	var now int64
	haveNow := false
	for i := range rls {
		// 1. descriptors
		if !descs.Add(&rls[i], i, x.req) {
			continue
		}
		d := &descs.Descriptors[len(descs.Descriptors)-1]
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
		if v := w.checks.table.Check(x.keys[start:], d.PrecheckCost(), now); v.Reject && !w.leases.covers(x.keys[start:], d, now) &&
			!w.checks.thawed(x.keys[start:], d.PrecheckCost(), now) {
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
	if w.leases.awaitCall(x, descs.Descriptors, now) {
		return Pause
	}
	// 5. shared blocks
	if w.checks.blocks != nil {
		if action, rejected := w.checks.checkShared(x, descs.Descriptors, &w.leases, &w.replies, now); rejected {
			return action
		}
	}
	// 6. call
	return w.callOut(x, now)
}
