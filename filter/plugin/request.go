package plugin

import (
	"github.com/sluicehq/sluice/filter/core/descriptors"
	"github.com/sluicehq/sluice/filter/core/headermap"
	"github.com/sluicehq/sluice/filter/core/limitheaders"
	"github.com/sluicehq/sluice/filter/core/precheck"
	"github.com/sluicehq/sluice/filter/core/rlsproto"
)

// onRequestHeaders decides a request: a local 429, a call to the control
// plane (pause), or through.
//
// The descriptors are built one at a time and each is prechecked as soon as
// it is built: the precheck decides each on its own, in order, so a request
// rejected on one needs none of the header reads of the later ones (each a
// host call). The clock is read once, when the first descriptor is checked
// (or before the call when the precheck is off); that time is also the
// call's SentAt, which may be earlier than the send, never later, as the
// precheck's bounds need.
func (p *Plugin) onRequestHeaders(s *stream) uint32 {
	if p.cfg == nil || s.state != stateIdle {
		return ActionContinue
	}
	s.state = stateDone
	rls := p.cfg.RateLimits
	p.descs.Reset()
	var now int64
	haveNow := false
	for i := range rls {
		if !p.descs.Add(&rls[i], i, p.req) {
			continue
		}
		d := &p.descs.Descriptors[len(p.descs.Descriptors)-1]
		if d.Usage {
			p.requestCost(d)
		}
		start := len(s.keys)
		s.keys = descriptors.AppendKey(s.keys, d)
		s.keyEnds = append(s.keyEnds, len(s.keys))
		if !p.precheck {
			continue
		}
		if !haveNow {
			now, haveNow = p.host.Now(), true
		}
		if v := p.table.Check(s.keys[start:], d.PrecheckCost(), now); v.Reject && !p.quotaCovers(s.keys[start:], d, now) {
			p.count(p.metrics.precheckRejected)
			return p.rejectLocally(s, d.RateLimit, v)
		}
	}
	if len(p.descs.Descriptors) == 0 {
		return ActionContinue
	}
	if !haveNow {
		now = p.host.Now()
	}
	if p.spendQuota(s, now) {
		return ActionContinue
	}
	if p.waitForCall(s, now) || p.waitForOther(s, now) {
		return ActionPause
	}
	if p.shared != nil {
		if action, rejected := p.checkShared(s, now); rejected {
			return action
		}
	}
	return p.callOut(s, now)
}

// callOut asks the control plane about the descriptors in p.descs (their
// precheck keys are in s.keys) and pauses the request until the answer.
// It is apart from onRequestHeaders, which it would slow down: in
// filter.wasm, the more code and variables a function has, the more each of
// its branches costs.
func (p *Plugin) callOut(s *stream, now int64) uint32 {
	descs := p.descs.Descriptors
	for i := range descs {
		s.costs = append(s.costs, int64(descs[i].HitsAddend))
		s.rateLimits = append(s.rateLimits, descs[i].RateLimit)
	}
	p.body = rlsproto.AppendRequestFrame(p.body[:0], p.cfg.Domain, descs, p.caller())
	callID, err := p.send(p.body)
	if err != nil {
		p.called(s) // nobody waits for a call that was not made
		// (a usage-based request failed open settles its whole usage)
		return p.fail(s, "cannot call the control plane (cluster "+p.cfg.Cluster+"): "+err.Error(), false)
	}
	s.state, s.callID, s.sentAt = statePending, callID, now
	p.calls[callID] = s
	p.ask(s)
	return ActionPause
}

// send makes a decision call of frame (a RateLimitRequest in gRPC's
// framing) over the plugin's transport and returns the call's id.
func (p *Plugin) send(frame []byte) (uint32, error) {
	if p.grpcService != nil {
		return p.host.GRPCCall(p.grpcService, rlsproto.ServiceName, rlsproto.MethodName, frame[rlsproto.FrameHeaderLen:], p.timeout)
	}
	return p.host.HTTPCall(p.cfg.Cluster, p.headers, frame, p.timeout)
}

// caller is how the filter names itself to the control plane
// (rlsproto.QuotaField): this Envoy, so that a lease's share is divided
// among Envoys, not workers.
func (p *Plugin) caller() uint64 {
	if p.quotas.pool == nil {
		return 1 // any caller
	}
	return p.quotas.pool.Proxy()
}

// replyCache remembers the headers of the last precheck reply.
type replyCache struct {
	valid     bool
	rateLimit int    // the rejecting descriptor's rate limit
	version   uint64 // the Version of its policy (limit and name)...
	hasPolicy bool   // ...if it has one
	seconds   int64  // the retry-after in whole seconds
	headers   []byte // serialized
}

// rejectLocally answers 429 for a request the precheck rejected.
func (p *Plugin) rejectLocally(s *stream, rateLimit int, v precheck.Verdict) uint32 {
	secs := limitheaders.Seconds(v.RetryAfter)
	c := &p.reply
	if !c.valid || c.rateLimit != rateLimit || c.hasPolicy != (v.Policy != nil) || (v.Policy != nil && c.version != v.Policy.Version) || c.seconds != secs {
		p.buildReply(rateLimit, v, secs)
	}
	if err := p.host.SendLocalResponse(429, DetailsPrecheck, bodyOverLimit, c.headers); err != nil {
		p.warn("sluice: cannot send the local reply: " + err.Error())
		return ActionContinue
	}
	return ActionPause
}

// buildReply fills p.reply with the headers of a precheck rejection by
// rateLimit whose retry-after is secs whole seconds. The limit is named as
// the control plane named it (current_limit.name), so that a client sees
// the same policy whichever of the two rejects it.
func (p *Plugin) buildReply(rateLimit int, v precheck.Verdict, secs int64) {
	var version uint64
	p.policies = p.policies[:0]
	if pol := v.Policy; pol != nil {
		version = pol.Version
		name := pol.Name
		if name == "" {
			name = p.name(rateLimit)
		}
		p.policies = append(p.policies, limitheaders.Policy{
			Name: name, Quota: pol.Limit.Limit, Window: pol.Limit.Window, Remaining: 0, Reset: v.RetryAfter,
		})
	}
	p.local.reset()
	p.addLimitHeaders(&p.local, p.policies)
	if p.cfg.Headers.RetryAfter {
		p.local.begin(limitheaders.RetryAfterHeader)
		p.local.buf = limitheaders.AppendRetryAfter(p.local.buf, v.RetryAfter)
		p.local.end()
	}
	p.local.add("content-type", "text/plain")
	c := &p.reply
	*c = replyCache{valid: true, rateLimit: rateLimit, version: version, hasPolicy: v.Policy != nil, seconds: secs,
		headers: headermap.Append(c.headers[:0], p.local.list())}
}

// addLimitHeaders appends the configured rate limit headers for ps.
func (p *Plugin) addLimitHeaders(h *headerList, ps []limitheaders.Policy) {
	if len(ps) == 0 {
		return
	}
	if p.cfg.Headers.Draft10 {
		h.begin(limitheaders.PolicyHeader)
		h.buf = limitheaders.AppendPolicy(h.buf, ps)
		h.end()
		h.begin(limitheaders.RateLimitHeader)
		h.buf = limitheaders.AppendRateLimit(h.buf, ps)
		h.end()
	}
	if p.cfg.Headers.Legacy {
		m := &ps[limitheaders.MostRestrictive(ps)]
		h.begin(limitheaders.LegacyLimit)
		h.buf = limitheaders.AppendInt(h.buf, m.Quota)
		h.end()
		h.begin(limitheaders.LegacyRemaining)
		h.buf = limitheaders.AppendInt(h.buf, m.Remaining)
		h.end()
		h.begin(limitheaders.LegacyReset)
		h.buf = limitheaders.AppendSeconds(h.buf, m.Reset)
		h.end()
	}
}
