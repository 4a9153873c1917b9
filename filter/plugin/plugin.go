package plugin

import (
	"strconv"
	"strings"
	"unsafe"

	"github.com/sluicehq/sluice/filter/config"
	"github.com/sluicehq/sluice/filter/descriptors"
	"github.com/sluicehq/sluice/filter/headermap"
	"github.com/sluicehq/sluice/filter/limitheaders"
	"github.com/sluicehq/sluice/filter/precheck"
	"github.com/sluicehq/sluice/filter/rlsproto"
)

// Metric names (Envoy shows them with its "wasmcustom." prefix).
const (
	MetricAllowed          = "sluice.allowed"           // the control plane admitted the request
	MetricOverLimit        = "sluice.over_limit"        // the control plane denied it: 429
	MetricPrecheckRejected = "sluice.precheck_rejected" // rejected locally, without a call: 429
	MetricErrors           = "sluice.errors"            // call failed, timed out, bad answer, or panic
	MetricFailureOpen      = "sluice.failure_open"      // ... and the request went through
	MetricFailureClosed    = "sluice.failure_closed"    // ... and the request was refused
)

// Response details of the local replies (Envoy's %RESPONSE_CODE_DETAILS%).
const (
	DetailsOverLimit = "sluice_over_limit"
	DetailsPrecheck  = "sluice_precheck_over_limit"
	DetailsFailure   = "sluice_rate_limit_service_error"
)

var (
	bodyOverLimit = []byte("rate limited\n")
	bodyFailure   = []byte("rate limit service unavailable\n")
)

const (
	tickPeriodMs = 1000
	// overdueGrace is how long past its timeout a call may stay unanswered
	// before the tick gives up on it (the proxy should answer at the timeout).
	overdueGrace = config.Second
	// maxAnswer bounds the control plane's answer.
	maxAnswer = 1 << 20
	// logEvery spaces out repeated warnings.
	logEvery = config.Second
)

// Stream states.
const (
	stateIdle      uint8 = iota // headers not seen yet
	statePending                // the control plane is being asked
	stateAnswering              // its answer is being applied; the request still waits
	stateHeld                   // admitted, held until releaseAt (shaping, see hold.go)
	stateDone                   // decided
)

// stream is one HTTP request/response pair.
type stream struct {
	id      uint32
	plugin  *Plugin
	state   uint8
	deleted bool // the proxy deleted the context; only the answer is awaited
	callID  uint32
	sentAt  int64
	// Shaping (hold.go): when the request was held and is to be resumed.
	heldAt, releaseAt int64
	// What was sent, one entry per descriptor, for the answer.
	keys       []byte  // precheck keys, concatenated
	keyEnds    []int   // keys[keyEnds[i-1]:keyEnds[i]] is descriptor i's
	costs      []int64 // hits_addend
	rateLimits []int   // index of the configured rate limit
	// Headers to add to the response.
	response headerList
}

func (s *stream) reset(id uint32, p *Plugin) {
	s.id, s.plugin, s.state, s.deleted, s.callID, s.sentAt = id, p, stateIdle, false, 0, 0
	s.heldAt, s.releaseAt = 0, 0
	s.keys, s.keyEnds, s.costs, s.rateLimits = s.keys[:0], s.keyEnds[:0], s.costs[:0], s.rateLimits[:0]
	s.response.reset()
}

func (s *stream) key(i int) []byte {
	start := 0
	if i > 0 {
		start = s.keyEnds[i-1]
	}
	return s.keys[start:s.keyEnds[i]]
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

func bufString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

// metrics holds the counters' ids.
type metrics struct {
	allowed, overLimit, precheckRejected, errors, failureOpen, failureClosed uint32
	held, delayed, delayedMs, holdRejected, holdAbandon                      uint32
}

// Plugin is one plugin instance (root context) and its configuration.
type Plugin struct {
	id   uint32
	host Host
	req  descriptors.Request // host, converted once: what the actions read
	cfg  *config.Config
	// table remembers what the control plane said about each descriptor:
	// the precheck's state, and the failure modes (kept with the precheck
	// off too).
	table    *precheck.Table
	precheck bool               // the precheck is on
	calls    map[uint32]*stream // calls out, by call id
	held     []*stream          // requests held (shaping), by release time
	tickMs   uint32             // the tick period last set
	names    []string           // default policy name of each rate limit
	headers  []byte             // request headers of the gRPC call, serialized
	timeout  uint32             // call timeout, ms
	metrics  metrics
	// The last precheck reply's headers, serialized: a flood of requests for
	// one descriptor gets the same reply until its retry-after (in whole
	// seconds) changes.
	reply replyCache
	// Scratch space reused by every request (the VM is single-threaded).
	descs    descriptors.Set
	body     []byte
	resp     rlsproto.Response
	policies []limitheaders.Policy
	local    headerList
	localMap []byte // p.local serialized
	// quotas are the control plane's grants in advance (see quota.go).
	quotas quotas
	// Warnings are logged at most once per logEvery.
	lastWarn   int64
	suppressed int
}

func newPlugin(id uint32, host Host) *Plugin {
	return &Plugin{id: id, host: host, calls: make(map[uint32]*stream), req: host, lastWarn: -logEvery}
}

// configure reads and applies the plugin configuration.
func (p *Plugin) configure(size int) bool {
	data, err := p.host.PluginConfiguration(size)
	if err != nil {
		p.host.Log(LogError, "sluice: cannot read the plugin configuration: "+err.Error())
		return false
	}
	cfg, err := config.Parse(data)
	if err != nil {
		p.host.Log(LogError, "sluice: invalid plugin configuration: "+err.Error())
		return false
	}
	p.cfg = cfg
	p.table = precheck.NewTable(cfg.Precheck.MaxEntries, cfg.Timeout)
	p.precheck = cfg.Precheck.Enabled
	p.timeout = uint32(cfg.Timeout / config.Millisecond)
	p.headers = headermap.Append(nil, [][2]string{
		{":method", "POST"},
		{":path", rlsproto.ShouldRateLimitPath},
		{":authority", cfg.Authority},
		{":scheme", "http"},
		{"content-type", "application/grpc"},
		{"te", "trailers"},
		{"grpc-timeout", string(rlsproto.AppendGRPCTimeout(nil, cfg.Timeout))},
	})
	p.reply = replyCache{}
	p.names = policyNames(cfg.RateLimits)
	for _, m := range []struct {
		name string
		id   *uint32
	}{
		{MetricAllowed, &p.metrics.allowed},
		{MetricOverLimit, &p.metrics.overLimit},
		{MetricPrecheckRejected, &p.metrics.precheckRejected},
		{MetricErrors, &p.metrics.errors},
		{MetricFailureOpen, &p.metrics.failureOpen},
		{MetricFailureClosed, &p.metrics.failureClosed},
		{MetricDelayed, &p.metrics.delayed},
		{MetricDelayedMs, &p.metrics.delayedMs},
		{MetricHoldRejected, &p.metrics.holdRejected},
		{MetricHoldAbandon, &p.metrics.holdAbandon},
	} {
		id, err := p.host.DefineCounter(m.name)
		if err != nil {
			p.host.Log(LogWarn, "sluice: cannot define metric "+m.name+": "+err.Error())
		}
		*m.id = id
	}
	if id, err := p.host.DefineGauge(MetricHeld); err != nil {
		p.host.Log(LogWarn, "sluice: cannot define metric "+MetricHeld+": "+err.Error())
	} else {
		p.metrics.held = id
	}
	if err := p.host.SetTickPeriod(tickPeriodMs); err != nil {
		p.host.Log(LogWarn, "sluice: cannot set the tick period: "+err.Error())
	}
	p.tickMs = tickPeriodMs
	p.host.Log(LogInfo, "sluice: configured for domain "+cfg.Domain+" with "+
		strconv.Itoa(len(cfg.RateLimits))+" rate limits, control plane cluster "+cfg.Cluster)
	return true
}

// policyNames names each rate limit after its descriptor keys ("api_key.path"),
// for the RateLimit headers when the control plane gives no name.
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

func (p *Plugin) name(rateLimit int) string {
	if rateLimit >= 0 && rateLimit < len(p.names) {
		return p.names[rateLimit]
	}
	return "limit_" + strconv.Itoa(rateLimit)
}

func (p *Plugin) count(id uint32) { p.host.IncrementCounter(id, 1) }

// warn logs a warning, at most one per logEvery; the others are counted
// and reported with the next one.
func (p *Plugin) warn(msg string) {
	now := p.host.Now()
	if now-p.lastWarn < logEvery {
		p.suppressed++
		return
	}
	if p.suppressed > 0 {
		msg += " (" + strconv.Itoa(p.suppressed) + " similar messages suppressed)"
	}
	p.lastWarn, p.suppressed = now, 0
	p.host.Log(LogWarn, msg)
}

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
		start := len(s.keys)
		s.keys = descriptors.AppendKey(s.keys, d)
		s.keyEnds = append(s.keyEnds, len(s.keys))
		if !p.precheck {
			continue
		}
		if !haveNow {
			now, haveNow = p.host.Now(), true
		}
		if v := p.table.Check(s.keys[start:], int64(d.HitsAddend), now); v.Reject && !p.quotaCovers(s.keys[start:], d.HitsAddend, now) {
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
	return p.callOut(s, now)
}

// callOut asks the control plane about the descriptors in p.descs (their
// precheck keys are in s.keys) and pauses the request until the answer.
// It is apart from onRequestHeaders, which it would slow down: in
// filter.wasm, the more code and variables a function has, the more each of
// its branches costs.
func (p *Plugin) callOut(s *stream, now int64) uint32 {
	descs := p.descs.Descriptors
	p.body = rlsproto.AppendRequestFrame(p.body[:0], p.cfg.Domain, descs)
	callID, err := p.host.HTTPCall(p.cfg.Cluster, p.headers, p.body, p.timeout)
	if err != nil {
		return p.fail(s, "cannot call the control plane (cluster "+p.cfg.Cluster+"): "+err.Error(), false)
	}
	s.state, s.callID, s.sentAt = statePending, callID, now
	for i := range descs {
		s.costs = append(s.costs, int64(descs[i].HitsAddend))
		s.rateLimits = append(s.rateLimits, descs[i].RateLimit)
	}
	p.calls[callID] = s
	return ActionPause
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

// onAnswer takes the control plane's answer for a stream's call.
func (p *Plugin) onAnswer(s *stream, numHeaders, bodySize int) {
	s.state = stateAnswering
	if !s.deleted {
		if err := p.host.SetEffectiveContext(s.id); err != nil {
			p.warn("sluice: stream " + strconv.FormatUint(uint64(s.id), 10) + " is gone: " + err.Error())
			s.deleted = true
		}
	}
	if reason := p.readAnswer(numHeaders, bodySize); reason != "" {
		p.fail(s, reason, true)
		return
	}
	resp := &p.resp
	now := p.host.Now()
	if len(resp.Statuses) == len(s.costs) {
		p.record(s, now)
	}
	switch resp.OverallCode {
	case rlsproto.CodeOK:
		s.state = stateDone
		p.count(p.metrics.allowed)
		p.recordQuotas(s, now)
		if s.deleted {
			return
		}
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
// answer is unusable, or "".
func (p *Plugin) readAnswer(numHeaders, bodySize int) string {
	if numHeaders == 0 {
		return "no answer from the control plane (timeout or connection failure)"
	}
	if status, _ := p.host.CallResponseHeader(":status"); status != "200" {
		return "the control plane answered HTTP status " + strconv.Quote(status)
	}
	gs, ok := p.host.CallResponseTrailer("grpc-status")
	if !ok {
		gs, ok = p.host.CallResponseHeader("grpc-status") // a trailers-only answer
	}
	if !ok {
		return "the control plane's answer has no grpc-status"
	}
	code, ok := rlsproto.ParseGRPCStatus(gs)
	if !ok {
		return "the control plane's answer has an invalid grpc-status " + strconv.Quote(gs)
	}
	if code != rlsproto.GRPCOK {
		msg, ok := p.host.CallResponseTrailer("grpc-message")
		if !ok {
			msg, _ = p.host.CallResponseHeader("grpc-message")
		}
		return "the control plane answered gRPC status " + gs + ": " + msg
	}
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
	}
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

// onResponseHeaders adds the headers of an admitted request's answer.
func (p *Plugin) onResponseHeaders(s *stream) {
	for _, h := range s.response.list() {
		if err := p.host.AddResponseHeader(h[0], h[1]); err != nil {
			p.warn("sluice: cannot add response header " + h[0] + ": " + err.Error())
		}
	}
	s.response.reset()
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
