package core

import (
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/filter/core/config"
	"github.com/sluicehq/sluice/filter/core/headermap"
	"github.com/sluicehq/sluice/filter/core/limitheaders"
	"github.com/sluicehq/sluice/filter/core/precheck"
	"github.com/sluicehq/sluice/filter/core/rlsproto"
)

// Response details of the local replies (Envoy's %RESPONSE_CODE_DETAILS%).
const (
	DetailsOverLimit = "sluice_over_limit"
	DetailsPrecheck  = "sluice_precheck_over_limit"
	DetailsFailure   = "sluice_rate_limit_service_error"
	// DetailsHoldFull is the response detail of a 429 for a request the
	// worker could not hold (shaping).
	DetailsHoldFull = "sluice_hold_full"
)

// HeaderFailureMode is the response header that says the failure mode
// decided the request (headers.failure_mode in the plugin configuration):
// "open" on the upstream's response, "closed" on the local reply.
const HeaderFailureMode = "x-sluice-failure-mode"

var (
	bodyOverLimit = []byte("rate limited\n")
	bodyFailure   = []byte("rate limit service unavailable\n")
)

// replies builds the headers of the local replies and the rate limit
// headers of admitted requests, as the configuration asks.
type replies struct {
	headers config.Headers
	names   []string // default policy name of each rate limit
	// The last precheck reply's headers, serialized: a flood of requests
	// for one descriptor gets the same reply until its retry-after (in
	// whole seconds) changes.
	cache    replyCache
	policies []limitheaders.Policy // scratch
	local    headerList            // scratch
	localMap []byte                // local, serialized
}

// newReplies returns the replies of e's configuration.
func newReplies(e *env) replies {
	return replies{headers: e.cfg.Headers, names: policyNames(e.cfg.RateLimits)}
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

// policyNames names each rate limit after its descriptor keys
// ("api_key.path"), for the RateLimit headers when the control plane gives
// no name.
func policyNames(rls []config.RateLimit) []string {
	names := make([]string, len(rls))
	seen := make(map[string]bool, len(rls))
	for i, rl := range rls {
		keys := make([]string, len(rl.Actions))
		for j, a := range rl.Actions {
			keys[j] = a.DescriptorKey
		}
		name := strings.Join(keys, ".")
		if seen[name] {
			name += "_" + strconv.Itoa(i)
		}
		seen[name] = true
		names[i] = name
	}
	return names
}

// name returns the default policy name of rate limit rateLimit.
func (r *replies) name(rateLimit int) string {
	if rateLimit >= 0 && rateLimit < len(r.names) {
		return r.names[rateLimit]
	}
	return "limit_" + strconv.Itoa(rateLimit)
}

// holds reports whether c holds the headers of a rejection by rateLimit
// with verdict v, secs whole seconds of retry-after.
func (c *replyCache) holds(rateLimit int, v precheck.Verdict, secs int64) bool {
	return c.valid && c.rateLimit == rateLimit && c.hasPolicy == (v.Policy != nil) &&
		(v.Policy == nil || c.version == v.Policy.Version) && c.seconds == secs
}

// buildPrecheck fills the cache with the headers of a precheck rejection
// by rateLimit whose retry-after is secs whole seconds, and returns them
// (serialized, valid until the next reply): the cache holds them as long
// as later rejections have the same policy and retry-after in whole
// seconds (replyCache.holds). The limit is named as the control plane
// named it (current_limit.name), so that a client sees the same policy
// whichever of the two rejects it.
func (r *replies) buildPrecheck(rateLimit int, v precheck.Verdict, secs int64) []byte {
	var version uint64
	r.policies = r.policies[:0]
	if pol := v.Policy; pol != nil {
		version = pol.Version
		name := pol.Name
		if name == "" {
			name = r.name(rateLimit)
		}
		r.policies = append(r.policies, limitheaders.Policy{
			Name: name, Quota: pol.Limit.Limit, Window: pol.Limit.Window, Remaining: 0, Reset: v.RetryAfter,
		})
	}
	r.local.reset()
	r.addLimitHeaders(&r.local, r.policies)
	r.addRetryAfter(v.RetryAfter)
	r.local.add("content-type", "text/plain")
	c := &r.cache
	*c = replyCache{valid: true, rateLimit: rateLimit, version: version, hasPolicy: v.Policy != nil, seconds: secs,
		headers: headermap.Append(c.headers[:0], r.local.list())}
	return c.headers
}

// addRetryAfter adds Retry-After to the local reply being built, if the
// configuration asks for it.
func (r *replies) addRetryAfter(retry int64) {
	if r.headers.RetryAfter {
		r.local.begin(limitheaders.RetryAfterHeader)
		r.local.buf = limitheaders.AppendRetryAfter(r.local.buf, retry)
		r.local.end()
	}
}

// admitted sets the headers an admitted request's response gets from the
// answer resp to its call s: the rate limit headers, and those the control
// plane adds (but its own rate limit headers).
func (r *replies) admitted(h *headerList, s *sent, resp *rlsproto.Response) {
	r.buildPolicies(s, resp)
	h.reset()
	r.addLimitHeaders(h, r.policies)
	for _, kv := range resp.ResponseHeadersToAdd {
		if !limitheaders.IsLimitHeader(kv.Key) {
			h.add(kv.Key, kv.Value)
		}
	}
}

// overLimit returns the headers of the 429 of a request the answer resp
// to its call s denies (serialized, valid until the next reply).
func (r *replies) overLimit(s *sent, resp *rlsproto.Response) []byte {
	r.buildPolicies(s, resp)
	r.local.reset()
	r.addLimitHeaders(&r.local, r.policies)
	if retry := retryAfter(resp); retry > 0 {
		r.addRetryAfter(retry)
	}
	for _, kv := range resp.ResponseHeadersToAdd {
		if !limitheaders.IsLimitHeader(kv.Key) {
			r.local.add(kv.Key, kv.Value)
		}
	}
	return r.plain()
}

// failed returns the headers of a request's local reply when the failure
// mode refuses it.
func (r *replies) failed() []byte {
	r.local.reset()
	r.local.add("content-type", "text/plain")
	if r.headers.FailureMode {
		r.local.add(HeaderFailureMode, "closed")
	}
	return r.serialize()
}

// holdFull returns the headers of the 429 of a request the worker could
// not hold.
func (r *replies) holdFull() []byte {
	r.local.reset()
	return r.plain()
}

// plain adds content-type text/plain to the local reply being built and
// serializes it.
func (r *replies) plain() []byte {
	r.local.add("content-type", "text/plain")
	return r.serialize()
}

// serialize returns the local reply's headers serialized.
func (r *replies) serialize() []byte {
	r.localMap = headermap.Append(r.localMap[:0], r.local.list())
	return r.localMap
}

// buildPolicies fills r.policies from the answer resp to call s.
func (r *replies) buildPolicies(s *sent, resp *rlsproto.Response) {
	r.policies = r.policies[:0]
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
			name = r.name(rl)
		}
		pol := limitheaders.Policy{Name: name, Quota: lim.Limit, Window: lim.Window, Remaining: int64(st.LimitRemaining)}
		if st.Code == rlsproto.CodeOverLimit {
			pol.Remaining = 0
		}
		if st.HasReset {
			pol.Reset = st.DurationUntilReset
		}
		r.policies = append(r.policies, pol)
	}
}

// retryAfter returns the longest retry-after of the over-limit descriptors
// in resp (ns), 0 when none is known.
func retryAfter(resp *rlsproto.Response) int64 {
	var retry int64
	for i := range resp.Statuses {
		if resp.Statuses[i].Code == rlsproto.CodeOverLimit {
			retry = max(retry, descriptorRetryAfter(resp, i))
		}
	}
	return retry
}

// addLimitHeaders appends the configured rate limit headers for ps.
func (r *replies) addLimitHeaders(h *headerList, ps []limitheaders.Policy) {
	if len(ps) == 0 {
		return
	}
	if r.headers.Draft10 {
		h.begin(limitheaders.PolicyHeader)
		h.buf = limitheaders.AppendPolicy(h.buf, ps)
		h.end()
		h.begin(limitheaders.RateLimitHeader)
		h.buf = limitheaders.AppendRateLimit(h.buf, ps)
		h.end()
	}
	if r.headers.Legacy {
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
