package core

import (
	"strconv"

	"github.com/sluicehq/sluice/filter/core/rlsproto"
)

// answered applies the answer a to x's call: the request is admitted,
// denied, held or failed, and the requests that waited for the call wake.
func (w *Worker) answered(x *Exchange, a *rlsproto.Answer) {
	w.current = x
	x.state = stateAnswering
	reason := a.Failure
	if reason == "" {
		if err := rlsproto.Decode(a.Message, &w.resp); err != nil {
			reason = err.Error()
		}
	}
	w.decide(x, reason, a.TimedOut)
	w.current = nil
	w.leases.called(x)
	w.exchanges.release(x)
}

// decide applies the answer decoded into w.resp to x's request, or the
// failure mode when reason says why there is no usable answer.
func (w *Worker) decide(x *Exchange, reason string, timedOut bool) {
	if reason != "" {
		if timedOut {
			reason += timeoutHint(w.cfg.Timeout)
		}
		w.fail(x, reason, true)
		return
	}
	resp := &w.resp
	// An admitted answer is recorded without the time (a host call fewer)
	// when nothing else needs it: no quota, no wait.
	var now int64
	haveNow := false
	if resp.OverallCode != rlsproto.CodeOK || !w.checks.recordAdmitted(&x.sent, resp) {
		now, haveNow = w.host.Now(), true
		if len(resp.Statuses) == len(x.costs) {
			w.checks.record(&x.sent, resp, now)
		}
	}
	switch resp.OverallCode {
	case rlsproto.CodeOK:
		x.state = stateDone
		w.count(mAllowed)
		if !haveNow && answerHasQuota(resp) {
			now, haveNow = w.host.Now(), true
		}
		w.leases.recordQuotas(x, resp, now) // (needs now only for a quota)
		if x.closed {
			return
		}
		w.admit(x, resp, now, haveNow)
	case rlsproto.CodeOverLimit:
		x.state = stateDone
		w.count(mOverLimit)
		if x.closed {
			return
		}
		if err := x.stream.SendLocalReply(429, DetailsOverLimit, bodyOverLimit, w.replies.overLimit(&x.sent, resp)); err != nil {
			w.warn("sluice: cannot send the local reply: " + err.Error())
			w.resume(x)
		}
	default:
		w.fail(x, "the control plane answered with overall code "+strconv.FormatUint(uint64(resp.OverallCode), 10), true)
	}
}

// admit lets x's request go on (or holds it, shaping) with the headers of
// the admitting answer resp; now is the time, if haveNow.
func (w *Worker) admit(x *Exchange, resp *rlsproto.Response, now int64, haveNow bool) {
	w.usage.arm(x, true, resp)
	w.replies.admitted(&x.response, &x.sent, resp)
	for _, h := range resp.RequestHeadersToAdd {
		if err := x.stream.AddRequestHeader(h.Key, h.Value); err != nil {
			w.warn("sluice: cannot add request header " + h.Key + ": " + err.Error())
		}
	}
	if wait := answerWait(resp); wait > 0 {
		if !haveNow {
			now = w.host.Now()
		}
		if w.shaping.hold(x, &w.replies, now, wait) {
			w.schedule(now)
		}
		return
	}
	w.resume(x)
}
