package plugin

import (
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/filter/core/config"
	"github.com/sluicehq/sluice/filter/core/descriptors"
	"github.com/sluicehq/sluice/filter/core/headermap"
	"github.com/sluicehq/sluice/filter/core/limitheaders"
	"github.com/sluicehq/sluice/filter/core/precheck"
	"github.com/sluicehq/sluice/filter/core/rlsproto"
	"github.com/sluicehq/sluice/filter/proxywasm/shareddata"
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

// metrics holds the counters' ids.
type metrics struct {
	allowed, overLimit, precheckRejected, errors, failureOpen, failureClosed uint32
	held, delayed, delayedMs, holdRejected, holdAbandon                      uint32
	precheckShared, sharedRetries, sharedLost                                uint32
	usageMissing, usageDisconnects                                           uint32
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
	precheck bool // the precheck is on
	// shared is the over-limit blocks the VMs of the proxy share (see
	// shared.go); nil with the precheck or shared_state off.
	shared *shareddata.Store
	calls  map[uint32]*stream // calls out, by call id
	held   []*stream          // requests held (shaping), by release time
	// Requests waiting for a call under way (wait.go), and those calls by
	// their descriptors' precheck keys.
	waiting []*stream
	asking  map[string]*stream
	tickMs  uint32 // the tick period last set
	// nextTick is when the next tick is expected (ns): the last tick, or
	// the last change of period, plus the period.
	nextTick int64
	names    []string // default policy name of each rate limit
	headers  []byte   // request headers of the gRPC call, serialized
	// grpcService is the GrpcService of proxy_grpc_call, serialized; nil
	// when the calls go over proxy_http_call (transport "http").
	grpcService []byte
	timeout     uint32 // call timeout, ms
	metrics     metrics
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
	// renew renews the lease pools before they run out (renew.go).
	renew renewer
	// settle is the settlement queue of usage-based limits (settle.go),
	// whose batch tokens come from tokens, the VM's.
	settle settler
	tokens *tokenSource
	// Warnings are logged at most once per logEvery.
	lastWarn   int64
	suppressed int
}

func newPlugin(id uint32, host Host, tokens *tokenSource) *Plugin {
	return &Plugin{id: id, host: host, calls: make(map[uint32]*stream), req: host, lastWarn: -logEvery, tokens: tokens}
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
	// With shared_state off, the blocks stay in the VM's table and the
	// leases make a pool of the VM's own.
	var shared shareddata.Data = p.host
	if !cfg.SharedState {
		shared = shareddata.NewLocal()
	}
	p.shared = nil
	p.quotas = quotas{pool: shareddata.NewLeases(shared, cfg.Domain, shareddata.LeaseSlots)}
	// A VM that starts after another received a lease (a reload after a
	// trap, a new worker) reads the pools at once, not from its first
	// tick: a lease lasts about as long as the tick period, and one that a
	// trapped VM left would otherwise expire unspent.
	p.quotas.seen = p.quotas.pool.Announced()
	if p.precheck && cfg.SharedState {
		p.shared = shareddata.New(shared, cfg.Domain, shareddata.Slots)
	}
	p.timeout = uint32(cfg.Timeout / config.Millisecond)
	p.headers = headermap.Append(nil, rlsproto.CallHeaders(cfg.Authority, cfg.Timeout))
	p.grpcService = nil
	if cfg.Transport == config.TransportGRPC {
		p.grpcService = rlsproto.AppendGRPCService(nil, cfg.Cluster, cfg.Authority)
	}
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
		{MetricPrecheckShared, &p.metrics.precheckShared},
		{MetricSharedCASRetries, &p.metrics.sharedRetries},
		{MetricSharedLost, &p.metrics.sharedLost},
	} {
		id, err := p.host.DefineCounter(m.name)
		if err != nil {
			p.host.Log(LogWarn, "sluice: cannot define metric "+m.name+": "+err.Error())
		}
		*m.id = id
	}
	p.settle.configure(p, cfg, p.tokens)
	p.renew.configure(cfg)
	if cfg.HasUsage() {
		p.metrics.usageMissing = p.defineCounter(MetricUsageMissing)
		p.metrics.usageDisconnects = p.defineCounter(MetricUsageDisconnects)
	}
	if id, err := p.host.DefineGauge(MetricHeld); err != nil {
		p.host.Log(LogWarn, "sluice: cannot define metric "+MetricHeld+": "+err.Error())
	} else {
		p.metrics.held = id
	}
	if err := p.host.SetTickPeriod(tickPeriodMs); err != nil {
		p.host.Log(LogWarn, "sluice: cannot set the tick period: "+err.Error())
	}
	p.tickMs, p.nextTick = tickPeriodMs, p.host.Now()+tickPeriodMs*config.Millisecond
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
