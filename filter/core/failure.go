package core

import (
	"strconv"

	"github.com/sluicehq/sluice/filter/core/config"
	"github.com/sluicehq/sluice/filter/core/precheck"
)

// timeoutHint is what a timed-out check's warning adds: the setting that
// decides how long the filter waits.
func timeoutHint(timeout int64) string {
	return "; if the control plane is only slow, raise the plugin's timeout (now " +
		strconv.FormatInt(timeout/config.Millisecond, 10) + "ms)"
}

// fail applies the failure mode to x; paused says whether its request is
// waiting (it must then be resumed or answered). It returns the action for
// a request-headers hook.
func (w *Worker) fail(x *Exchange, reason string, paused bool) Action {
	x.state = stateDone
	w.count(mErrors)
	// Closed if the control plane last said that any of x's descriptors
	// fails closed, else open if it said that any fails open, else the
	// configuration's failure_mode.
	mode, source := w.cfg.FailureMode, ""
	switch w.checks.failureMode(&x.sent) {
	case precheck.FailureClosed:
		mode, source = config.FailClosed, " (the policy's failure mode)"
	case precheck.FailureOpen:
		mode, source = config.FailOpen, " (the policy's failure mode)"
	}
	w.warn("sluice: rate limit check failed, failing " + mode.String() + source + ": " + reason)
	if mode == config.FailOpen {
		w.count(mFailureOpen)
		w.usage.arm(x, false, nil) // it runs, its reserves not charged
		if w.cfg.Headers.FailureMode {
			x.response.add(HeaderFailureMode, "open")
		}
		if paused && !x.closed {
			w.resume(x)
		}
		return Continue
	}
	w.count(mFailureClosed)
	if x.closed {
		return Pause
	}
	if err := x.stream.SendLocalReply(w.cfg.StatusOnError, DetailsFailure, bodyFailure, w.replies.failed()); err != nil {
		w.warn("sluice: cannot send the local reply: " + err.Error())
		return Continue
	}
	return Pause
}

// failSafely is fail for the panic path: it cannot panic itself. A stream
// whose request was already let through or answered is left alone.
func (w *Worker) failSafely(x *Exchange, reason string, paused bool) (action Action) {
	action = Continue
	defer func() { _ = recover() }()
	if w.cfg == nil || (paused && x.state == stateDone) {
		return Continue
	}
	return w.fail(x, reason, paused)
}
