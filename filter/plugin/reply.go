// The replies the filter builds itself: a precheck rejection and the
// headers it adds, kept in buffers of their own.

package plugin

import (
	"unsafe"

	"github.com/sluicehq/sluice/filter/headermap"
	"github.com/sluicehq/sluice/filter/limitheaders"
	"github.com/sluicehq/sluice/filter/precheck"
)

// headerList builds a list of headers whose names and values live in one
// buffer, so that they outlive the host memory they were copied from.
type headerList struct {
	buf   []byte
	spans [][4]int // name start, name end, value start, value end
	pairs [][2]string
}

func (h *headerList) reset() {
	h.buf, h.spans, h.pairs = h.buf[:0], h.spans[:0], h.pairs[:0]
}

// begin starts a header: append its value to h.buf, then call end.
func (h *headerList) begin(name string) {
	start := len(h.buf)
	h.buf = append(h.buf, name...)
	h.spans = append(h.spans, [4]int{start, len(h.buf), len(h.buf), 0})
}

func (h *headerList) end() { h.spans[len(h.spans)-1][3] = len(h.buf) }

func (h *headerList) add(name, value string) {
	h.begin(name)
	h.buf = append(h.buf, value...)
	h.end()
}

// list returns the headers; valid until the next reset.
func (h *headerList) list() [][2]string {
	h.pairs = h.pairs[:0]
	for _, sp := range h.spans {
		h.pairs = append(h.pairs, [2]string{bufString(h.buf[sp[0]:sp[1]]), bufString(h.buf[sp[2]:sp[3]])})
	}
	return h.pairs
}

func bufString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
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
