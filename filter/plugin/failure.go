package plugin

import (
	"strconv"

	"github.com/sluicehq/sluice/filter/core/config"
	"github.com/sluicehq/sluice/filter/core/headermap"
	"github.com/sluicehq/sluice/filter/core/precheck"
)

// HeaderFailureMode is the response header that says the failure mode
// decided the request (headers.failure_mode in the plugin configuration):
// "open" on the upstream's response, "closed" on the local reply.
const HeaderFailureMode = "x-sluice-failure-mode"

// reasonNoAnswer is why a check failed when the proxy gave no answer: the
// call timed out (the plugin's timeout) or its connection failed.
const reasonNoAnswer = "no answer from the control plane (timeout or connection failure)"

// timeoutHint is what a timed-out check's warning adds: the setting that
// decides how long the filter waits.
func timeoutHint(timeout int64) string {
	return "; if the control plane is only slow, raise the plugin's timeout (now " +
		strconv.FormatInt(timeout/config.Millisecond, 10) + "ms)"
}

// failureMode returns the failure mode for a stream whose check failed, and
// whether it is the descriptors' (else the plugin's): closed if the control
// plane last said that any of the stream's descriptors fails closed, else
// open if it said that any fails open, else the plugin's failure_mode.
func (p *Plugin) failureMode(s *stream) (mode config.FailureMode, fromPolicy bool) {
	if p.table == nil {
		return p.cfg.FailureMode, false
	}
	open := false
	for i := range s.keyEnds {
		switch p.table.FailureMode(s.key(i)) {
		case precheck.FailureClosed:
			return config.FailClosed, true
		case precheck.FailureOpen:
			open = true
		}
	}
	if open {
		return config.FailOpen, true
	}
	return p.cfg.FailureMode, false
}

// fail applies the failure mode to a stream; paused says whether its request
// is waiting (it must then be resumed or answered). It returns the action
// for a request-headers callback.
func (p *Plugin) fail(s *stream, reason string, paused bool) uint32 {
	s.state = stateDone
	p.count(p.metrics.errors)
	mode, fromPolicy := p.failureMode(s)
	source := ""
	if fromPolicy {
		source = " (the policy's failure mode)"
	}
	p.warn("sluice: rate limit check failed, failing " + mode.String() + source + ": " + reason)
	if mode == config.FailOpen {
		p.count(p.metrics.failureOpen)
		p.arm(s, false) // it runs, its reserves not charged
		if p.cfg.Headers.FailureMode {
			s.response.add(HeaderFailureMode, "open")
		}
		if paused && !s.deleted {
			if err := p.host.ResumeRequest(); err != nil {
				p.warn("sluice: cannot resume the request: " + err.Error())
			}
		}
		return ActionContinue
	}
	p.count(p.metrics.failureClosed)
	if s.deleted {
		return ActionPause
	}
	p.local.reset()
	p.local.add("content-type", "text/plain")
	if p.cfg.Headers.FailureMode {
		p.local.add(HeaderFailureMode, "closed")
	}
	p.localMap = headermap.Append(p.localMap[:0], p.local.list())
	if err := p.host.SendLocalResponse(p.cfg.StatusOnError, DetailsFailure, bodyFailure, p.localMap); err != nil {
		p.warn("sluice: cannot send the local reply: " + err.Error())
		return ActionContinue
	}
	return ActionPause
}

// failSafely is fail for the panic path: it cannot panic itself. A stream
// whose request was already let through or answered is left alone.
func (p *Plugin) failSafely(s *stream, reason string, paused bool) (action uint32) {
	action = ActionContinue
	defer func() { _ = recover() }()
	if p.cfg == nil || (paused && s.state == stateDone) {
		return ActionContinue
	}
	return p.fail(s, reason, paused)
}

// overdue removes and returns the calls unanswered past their timeout and
// a grace period.
func (p *Plugin) overdue(now int64) []*stream {
	if p.cfg == nil {
		return nil
	}
	limit := p.cfg.Timeout + overdueGrace
	var late []*stream
	for id, s := range p.calls {
		if now-s.sentAt > limit {
			delete(p.calls, id)
			late = append(late, s)
		}
	}
	return late
}

// giveUp applies the failure mode to a call the proxy never answered.
func (p *Plugin) giveUp(s *stream) {
	if s.state != statePending {
		return
	}
	if !s.deleted {
		if err := p.host.SetEffectiveContext(s.id); err != nil {
			s.deleted = true
		}
	}
	p.fail(s, "the proxy never delivered the control plane's answer", true)
}
