package plugin

import (
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/filter/core/headermap"
	"github.com/sluicehq/sluice/filter/core/limitheaders"
	"github.com/sluicehq/sluice/filter/core/precheck"
	"github.com/sluicehq/sluice/filter/core/rlsproto"
)

// onAnswer takes the control plane's answer for a stream's call made over
// proxy_http_call.
func (p *Plugin) onAnswer(s *stream, numHeaders, bodySize int) {
	p.beginAnswer(s)
	reason, timedOut := p.readAnswer(numHeaders, bodySize)
	p.decide(s, reason, timedOut)
}

// beginAnswer makes the stream of an answered call the current one.
func (p *Plugin) beginAnswer(s *stream) {
	s.state = stateAnswering
	if !s.deleted {
		if err := p.host.SetEffectiveContext(s.id); err != nil {
			p.warn("sluice: stream " + strconv.FormatUint(uint64(s.id), 10) + " is gone: " + err.Error())
			s.deleted = true
		}
	}
}

// decide applies the answer decoded into p.resp to the stream's request,
// or the failure mode when reason says why there is no usable answer.
func (p *Plugin) decide(s *stream, reason string, timedOut bool) {
	if reason != "" {
		if timedOut {
			reason += timeoutHint(p.cfg.Timeout)
		}
		p.fail(s, reason, true)
		return
	}
	resp := &p.resp
	// An admitted answer is recorded without the time (a host call fewer)
	// when nothing else needs it: no quota, no wait.
	var now int64
	haveNow := false
	if resp.OverallCode != rlsproto.CodeOK || !p.recordAdmitted(s) {
		now, haveNow = p.host.Now(), true
		if len(resp.Statuses) == len(s.costs) {
			p.record(s, now)
		}
	}
	switch resp.OverallCode {
	case rlsproto.CodeOK:
		s.state = stateDone
		p.count(p.metrics.allowed)
		if !haveNow && p.quotas.pool != nil && answerHasQuota(resp) {
			now, haveNow = p.host.Now(), true
		}
		p.recordQuotas(s, now) // (needs now only for a quota)
		if s.deleted {
			return
		}
		p.arm(s, true)
		p.buildPolicies(s)
		s.response.reset()
		p.addLimitHeaders(&s.response, p.policies)
		for _, h := range resp.ResponseHeadersToAdd {
			if !limitheaders.IsLimitHeader(h.Key) {
				s.response.add(h.Key, h.Value)
			}
		}
		for _, h := range resp.RequestHeadersToAdd {
			if err := p.host.AddRequestHeader(h.Key, h.Value); err != nil {
				p.warn("sluice: cannot add request header " + h.Key + ": " + err.Error())
			}
		}
		if wait := p.answerWait(); wait > 0 {
			if !haveNow {
				now = p.host.Now()
			}
			p.hold(s, now, wait)
			return
		}
		p.resume(s)
	case rlsproto.CodeOverLimit:
		s.state = stateDone
		p.count(p.metrics.overLimit)
		if s.deleted {
			return
		}
		p.buildPolicies(s)
		p.local.reset()
		p.addLimitHeaders(&p.local, p.policies)
		if retry := p.retryAfter(); retry > 0 && p.cfg.Headers.RetryAfter {
			p.local.begin(limitheaders.RetryAfterHeader)
			p.local.buf = limitheaders.AppendRetryAfter(p.local.buf, retry)
			p.local.end()
		}
		for _, h := range resp.ResponseHeadersToAdd {
			if !limitheaders.IsLimitHeader(h.Key) {
				p.local.add(h.Key, h.Value)
			}
		}
		p.local.add("content-type", "text/plain")
		p.localMap = headermap.Append(p.localMap[:0], p.local.list())
		if err := p.host.SendLocalResponse(429, DetailsOverLimit, bodyOverLimit, p.localMap); err != nil {
			p.warn("sluice: cannot send the local reply: " + err.Error())
			if err := p.host.ResumeRequest(); err != nil {
				p.warn("sluice: cannot resume the request: " + err.Error())
			}
		}
	default:
		p.fail(s, "the control plane answered with overall code "+strconv.FormatUint(uint64(resp.OverallCode), 10), true)
	}
}

// readAnswer checks and decodes the answer into p.resp; it returns why the
// answer is unusable, or "", and whether the call timed out: no answer at
// all, DEADLINE_EXCEEDED, or the UNAVAILABLE "upstream request timeout"
// that Envoy itself answers when the call's timeout passes.
func (p *Plugin) readAnswer(numHeaders, bodySize int) (reason string, timedOut bool) {
	if numHeaders == 0 {
		return reasonNoAnswer, true
	}
	// A gRPC OK in the trailers is the common answer, and its :status is
	// not read (a host call, and a callback to allocate, fewer): a gRPC
	// server sends trailers after a 200 and a message, and a body that
	// does not decode as the answer fails below anyway.
	gs, ok := p.host.CallResponseTrailer("grpc-status")
	if ok && gs == "0" {
		return p.decodeAnswer(bodySize), false
	}
	if status, _ := p.host.CallResponseHeader(":status"); status != "200" {
		return "the control plane answered HTTP status " + strconv.Quote(status), false
	}
	if !ok {
		gs, ok = p.host.CallResponseHeader("grpc-status") // a trailers-only answer
	}
	if !ok {
		return "the control plane's answer has no grpc-status", false
	}
	code, ok := rlsproto.ParseGRPCStatus(gs)
	if !ok {
		return "the control plane's answer has an invalid grpc-status " + strconv.Quote(gs), false
	}
	if code != rlsproto.GRPCOK {
		msg, ok := p.host.CallResponseTrailer("grpc-message")
		if !ok {
			msg, _ = p.host.CallResponseHeader("grpc-message")
		}
		return "the control plane answered gRPC status " + gs + ": " + msg,
			code == rlsproto.GRPCDeadlineExceeded || (code == rlsproto.GRPCUnavailable && strings.Contains(msg, "timeout"))
	}
	return p.decodeAnswer(bodySize), false
}

// decodeAnswer reads the body of a gRPC OK answer and decodes it into
// p.resp; it returns why the answer is unusable, or "".
func (p *Plugin) decodeAnswer(bodySize int) string {
	if bodySize > maxAnswer {
		return "the control plane's answer is too large (" + strconv.Itoa(bodySize) + " bytes)"
	}
	body, err := p.host.CallResponseBody(bodySize)
	if err != nil {
		return "cannot read the control plane's answer: " + err.Error()
	}
	msg, err := rlsproto.ParseFrame(body)
	if err != nil {
		return err.Error()
	}
	if err := rlsproto.Decode(msg, &p.resp); err != nil {
		return err.Error()
	}
	return ""
}

// record tells the precheck what the control plane said about each
// descriptor of the stream's request.
func (p *Plugin) record(s *stream, now int64) {
	if p.table == nil {
		return
	}
	resp := &p.resp
	admitted := resp.OverallCode == rlsproto.CodeOK
	for i := range s.costs {
		lim, hasLimit := descriptorLimit(resp, i)
		o := precheck.Outcome{Cost: s.costs[i], Limit: lim, HasLimit: hasLimit, Admitted: admitted, SentAt: s.sentAt,
			Name: limitName(resp, i), FailureMode: descriptorFailureMode(resp, i)}
		// An over-limit descriptor in an answer that admits the request is
		// in quota mode (over, but not every quota descriptor is): the same
		// request would be admitted again, so it must not block.
		if resp.Statuses[i].Code == rlsproto.CodeOverLimit && !admitted {
			o.OverLimit, o.RetryAfter = true, descriptorRetryAfter(resp, i)
		}
		p.table.Record(s.key(i), o, now)
		if o.OverLimit && p.shared != nil {
			p.publish(s.key(i), o, now)
		}
	}
}

// recordAdmitted tells the precheck what the admitted answer in p.resp
// said about each descriptor of the stream's request, without the time its
// answer arrived (precheck.Table.RecordAdmitted: the charges wait for the
// table's next call given a time, which comes later). It returns false,
// recording nothing, when the charges cannot wait: the caller then reads
// the time and calls record.
func (p *Plugin) recordAdmitted(s *stream) bool {
	resp := &p.resp
	if p.table == nil || len(resp.Statuses) != len(s.costs) {
		return true
	}
	if p.table.Deferred()+len(s.costs) > precheck.MaxDeferred {
		return false
	}
	for i := range s.costs {
		lim, hasLimit := descriptorLimit(resp, i)
		p.table.RecordAdmitted(s.key(i), precheck.Outcome{Cost: s.costs[i], Limit: lim, HasLimit: hasLimit,
			Admitted: true, SentAt: s.sentAt, Name: limitName(resp, i), FailureMode: descriptorFailureMode(resp, i)})
	}
	return true
}

// answerHasQuota reports whether an admitted answer grants a quota that
// recordQuotas may take in.
func answerHasQuota(resp *rlsproto.Response) bool {
	for i := range resp.Statuses {
		if qt := &resp.Statuses[i].Quota; qt.Requests >= 2 && qt.ValidUntil != 0 {
			return true
		}
	}
	return false
}

// buildPolicies fills p.policies from the answer in p.resp.
func (p *Plugin) buildPolicies(s *stream) {
	p.policies = p.policies[:0]
	resp := &p.resp
	for i := range resp.Statuses {
		st := &resp.Statuses[i]
		lim, ok := descriptorLimit(resp, i)
		if !ok {
			continue
		}
		name := limitName(resp, i)
		if name == "" {
			rl := -1
			if i < len(s.rateLimits) {
				rl = s.rateLimits[i]
			}
			name = p.name(rl)
		}
		pol := limitheaders.Policy{Name: name, Quota: lim.Limit, Window: lim.Window, Remaining: int64(st.LimitRemaining)}
		if st.Code == rlsproto.CodeOverLimit {
			pol.Remaining = 0
		}
		if st.HasReset {
			pol.Reset = st.DurationUntilReset
		}
		p.policies = append(p.policies, pol)
	}
}

// retryAfter returns the longest retry-after of the over-limit descriptors
// in p.resp (ns), 0 when none is known.
func (p *Plugin) retryAfter() int64 {
	var retry int64
	for i := range p.resp.Statuses {
		if p.resp.Statuses[i].Code == rlsproto.CodeOverLimit {
			retry = max(retry, descriptorRetryAfter(&p.resp, i))
		}
	}
	return retry
}

// onResponseHeaders adds the headers of an admitted request's answer.
func (p *Plugin) onResponseHeaders(s *stream) {
	for _, h := range s.response.list() {
		if err := p.host.AddResponseHeader(h[0], h[1]); err != nil {
			p.warn("sluice: cannot add response header " + h[0] + ": " + err.Error())
		}
	}
	s.response.reset()
}
