package plugin

import (
	"strconv"

	"github.com/sluicehq/sluice/filter/core/config"
	"github.com/sluicehq/sluice/filter/core/headermap"
)

// Shaping: a request the control plane answers OK with a wait (algorithm
// reserve, wait_ms in the sluice metadata) is held, still paused after the
// call, and resumed when its wait is over.
//
// The plugin instance (one per Envoy worker) keeps its held requests in a
// list ordered by release time (ties in the order they were held) and
// resumes them on proxy_on_tick. While it holds requests it sets the tick
// period to the time until the earliest release (in whole milliseconds, at
// least 1), so a request is resumed at its release time rounded up to a
// millisecond plus the worker's event-loop latency, never before it; with
// nothing held the tick goes back to tickPeriodMs, so shaping costs an idle
// Envoy nothing. The wait counts from the answer's arrival: the control
// plane's slot began when it decided, so a request is resumed late by the
// answer's trip back, never early.
//
// At most config.MaxHeld requests are held at once; one beyond it is
// answered 429 (sluice.hold_rejected). A held request whose client goes
// away is dropped from the list when the proxy ends its stream
// (proxy_on_done, proxy_on_log or proxy_on_delete, whichever comes first). The
// request sent upstream carries HeaderDelayed, the milliseconds it was
// held; sluice.held is the gauge of requests held now, sluice.delayed the
// count of requests held, sluice.delayed_ms the sum of their holds.

// HeaderDelayed is the request header that tells the upstream how long the
// filter held the request, in whole milliseconds; with headers.delayed in
// the plugin configuration the client's response carries it too.
const HeaderDelayed = "x-sluice-delayed-ms"

// Metric names of shaping.
const (
	MetricHeld         = "sluice.held"           // gauge: requests held now
	MetricDelayed      = "sluice.delayed"        // requests held, then resumed
	MetricDelayedMs    = "sluice.delayed_ms"     // the milliseconds they were held, summed
	MetricHoldRejected = "sluice.hold_rejected"  // 429: the plugin already held max_held requests
	MetricHoldAbandon  = "sluice.hold_abandoned" // held requests whose client went away
)

// DetailsHoldFull is the response detail of a 429 for a request the plugin
// could not hold.
const DetailsHoldFull = "sluice_hold_full"

// maxWait bounds the wait the plugin accepts from an answer (the policy's
// bound on max_wait), so that a corrupt answer cannot hold a request for
// ever.
const maxWait = 3600 * config.Second

// answerWait returns the longest wait (ns) of the descriptors of an OK
// answer in p.resp.
func (p *Plugin) answerWait() int64 {
	var wait float64
	for i := range p.resp.Limits {
		wait = max(wait, p.resp.Limits[i].WaitMs)
	}
	if wait <= 0 {
		return 0
	}
	ns := wait * float64(config.Millisecond)
	if ns >= float64(maxWait) {
		return maxWait
	}
	return int64(ns + 0.999999) // whole nanoseconds, rounded up
}

// hold holds the current stream's request for wait ns from now, or answers
// 429 when the plugin holds max_held requests already.
func (p *Plugin) hold(s *stream, now, wait int64) {
	if len(p.held) >= p.cfg.MaxHeld {
		s.state = stateDone
		s.usage.armed = false // refused: it does not run
		p.count(p.metrics.holdRejected)
		p.local.reset()
		p.local.add("content-type", "text/plain")
		p.localMap = headermap.Append(p.localMap[:0], p.local.list())
		if err := p.host.SendLocalResponse(429, DetailsHoldFull, bodyOverLimit, p.localMap); err != nil {
			p.warn("sluice: cannot send the local reply: " + err.Error())
			p.resume(s)
		}
		return
	}
	s.state, s.heldAt, s.releaseAt = stateHeld, now, now+wait
	// Insert after every stream due at the same time or earlier: release
	// order is release time, then arrival.
	i := len(p.held)
	for i > 0 && p.held[i-1].releaseAt > s.releaseAt {
		i--
	}
	p.held = append(p.held, nil)
	copy(p.held[i+1:], p.held[i:])
	p.held[i] = s
	p.host.IncrementCounter(p.metrics.held, 1)
	if i == 0 {
		p.schedule(now)
	}
}

// resume lets a stream's request go on.
func (p *Plugin) resume(s *stream) {
	if err := p.host.ResumeRequest(); err != nil {
		p.warn("sluice: cannot resume the request: " + err.Error())
	}
}

// releaseDue resumes the held requests whose release time has come, in
// order, and sets the tick for the next one.
func (p *Plugin) releaseDue(now int64) {
	n := 0
	for n < len(p.held) && p.held[n].releaseAt <= now {
		s := p.held[n]
		n++
		s.state = stateDone
		p.host.IncrementCounter(p.metrics.held, -1)
		if err := p.host.SetEffectiveContext(s.id); err != nil {
			p.count(p.metrics.holdAbandon) // gone without a proxy_on_delete
			continue
		}
		ms := (now - s.heldAt) / config.Millisecond
		p.host.IncrementCounter(p.metrics.delayed, 1)
		if ms > 0 {
			p.host.IncrementCounter(p.metrics.delayedMs, ms)
		}
		if err := p.host.AddRequestHeader(HeaderDelayed, strconv.FormatInt(ms, 10)); err != nil {
			p.warn("sluice: cannot add request header " + HeaderDelayed + ": " + err.Error())
		}
		if p.cfg.Headers.Delayed {
			s.response.add(HeaderDelayed, strconv.FormatInt(ms, 10))
		}
		p.resume(s)
	}
	if n > 0 {
		clear(p.held[:n])
		p.held = append(p.held[:0], p.held[n:]...)
	}
	p.schedule(now)
}

// untilMs returns the tick period (ms) for something due in until ns: at
// least 1, at most tickPeriodMs.
func untilMs(until int64) uint32 {
	return uint32(max(1, min(tickPeriodMs, (until+config.Millisecond-1)/config.Millisecond)))
}

// unhold drops a held stream whose context the proxy deleted.
func (p *Plugin) unhold(s *stream) {
	for i, h := range p.held {
		if h == s {
			copy(p.held[i:], p.held[i+1:])
			p.held[len(p.held)-1] = nil
			p.held = p.held[:len(p.held)-1]
			p.host.IncrementCounter(p.metrics.held, -1)
			p.count(p.metrics.holdAbandon)
			break
		}
	}
	s.state = stateDone
	s.usage.armed = false // it never ran
}

// schedule sets the tick period: until the earliest release while requests
// are held, or until the settlements' next due time (settle.go) if sooner,
// else tickPeriodMs.
func (p *Plugin) schedule(now int64) {
	ms := uint32(tickPeriodMs)
	held := len(p.held) > 0
	if held {
		ms = untilMs(p.held[0].releaseAt - now)
	}
	if due, ok := p.settle.nextDue(); ok {
		ms = min(ms, untilMs(due-now))
	}
	if p.cfg != nil {
		if due, ok := p.renew.renewDue(p.cfg.Timeout); ok {
			ms = min(ms, untilMs(due-now))
		}
	}
	waits := p.waitsRemote()
	if waits {
		ms = waitTickMs // requests wait for another VM's call (wait.go)
	}
	if !held && !waits && p.tickMs == ms {
		return
	}
	p.tickMs, p.nextTick = ms, now+int64(ms)*config.Millisecond
	if err := p.host.SetTickPeriod(ms); err != nil {
		p.warn("sluice: cannot set the tick period: " + err.Error())
	}
}
