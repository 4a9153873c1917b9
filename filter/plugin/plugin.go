package plugin

import (
	"strconv"
	"strings"

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

// onResponseHeaders adds the headers of an admitted request's answer.
func (p *Plugin) onResponseHeaders(s *stream) {
	for _, h := range s.response.list() {
		if err := p.host.AddResponseHeader(h[0], h[1]); err != nil {
			p.warn("sluice: cannot add response header " + h[0] + ": " + err.Error())
		}
	}
	s.response.reset()
}
