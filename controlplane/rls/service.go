// Package rls serves envoy.service.ratelimit.v3.RateLimitService: one
// ShouldRateLimit call decides a request's descriptors against the policies
// of its domain, with the semantics of envoyproxy/ratelimit so that Envoy's
// own ratelimit filter works against it unchanged:
//
//   - the domain selects a policy; an unknown domain or descriptor is OK;
//   - descriptors are answered in order, one status each: code,
//     current_limit {requests_per_unit, unit, unit_multiplier, name},
//     limit_remaining (0 when the descriptor's limit refused the request)
//     and duration_until_reset (whole seconds, rounded up, as Envoy reads
//     only the seconds);
//   - the overall code is OVER_LIMIT if any enforced limit is over;
//   - hits_addend is the cost (0 means 1); a descriptor's own hits_addend
//     overrides it (0 there peeks: nothing is counted);
//   - shadow_mode limits are evaluated and counted but answer OK;
//   - unlimited descriptors answer OK with limit_remaining 2^32-1;
//   - replaces drops the named limits across the whole request;
//   - a descriptor's limit override (requests_per_unit, unit,
//     unit_multiplier) replaces its configured limits with a fixed window,
//     as envoyproxy/ratelimit does, when the domain is known.
//
// sluice adds several limits per descriptor (all must pass; the status
// reports the most restrictive; each is counted on its own, so a request one
// limit denies still counts in the others, as envoyproxy/ratelimit counts
// each descriptor of a request; unlike envoyproxy/ratelimit, a limit that
// refuses a request counts none of its cost), the IETF RateLimit headers (see
// rateLimitHeaders) and per-descriptor limit parameters in dynamic_metadata
// for the filter's local precheck (see MetadataKey).
//
// When the store fails, each limit's failure_mode decides: open answers OK,
// closed answers OVER_LIMIT with duration_until_reset FailureRetryAfter.
//
// Policies are held behind an atomic pointer and replaced whole
// (SetPolicies), so a decision sees one version from start to end.
package rls

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"sync/atomic"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/controlplane/policy"
	"github.com/sluicehq/sluice/controlplane/store"
	"github.com/sluicehq/sluice/shared/algorithms"
)

// Defaults and fixed values.
const (
	// DefaultMaxDescriptors bounds the descriptors of one request.
	DefaultMaxDescriptors = 256
	// DefaultMaxEntries bounds the entries of one descriptor.
	DefaultMaxEntries = 64
	// FailureRetryAfter is the duration_until_reset (and Retry-After) of a
	// limit answered OVER_LIMIT by failure_mode closed: how long a client
	// should wait before the store is asked again.
	FailureRetryAfter = time.Second
	// maxWindow bounds override windows as shared/algorithms bounds spans.
	maxWindow = time.Duration(1) << 61
)

// Options configures a Service. The zero value is usable.
type Options struct {
	// MaxDescriptors bounds the descriptors of one request; 0 means
	// DefaultMaxDescriptors. More is refused with InvalidArgument.
	MaxDescriptors int
	// MaxEntries bounds the entries of one descriptor; 0 means
	// DefaultMaxEntries. More is refused with InvalidArgument.
	MaxEntries int
	// Logger receives store errors (at most one line a second); nil means
	// slog.Default().
	Logger *slog.Logger
	// Registerer registers the metrics; nil means they are kept but not
	// registered.
	Registerer prometheus.Registerer
	// NearLimitRatio is the share of a limit past which admitted hits count
	// in sluice_rule_near_limit_total; 0 means DefaultNearLimitRatio.
	NearLimitRatio float64
	// MaxRuleValues bounds the request values a detailed_metric or
	// value_to_metric rule labels; 0 means DefaultMaxRuleValues.
	MaxRuleValues int
	// Quota, when set, shares leases with the filter in
	// DescriptorStatus.quota (see addQuotas); nil shares nothing.
	Quota Sharer
}

// Service implements rlsv3.RateLimitServiceServer.
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer

	store          store.Store
	policies       atomic.Pointer[version]
	maxDescriptors int
	maxEntries     int
	log            *slog.Logger
	metrics        *Metrics
	rules          *ruleMetrics
	lastErrLog     atomic.Int64 // Unix ns of the last store error logged
	quota          Sharer
}

// New returns a Service deciding on st with the given policies (nil means
// none: every domain is unknown and every request OK).
func New(st store.Store, policies *policy.Set, opts Options) (*Service, error) {
	if st == nil {
		return nil, fmt.Errorf("rls: store is nil")
	}
	if opts.MaxDescriptors < 0 || opts.MaxEntries < 0 || opts.MaxRuleValues < 0 {
		return nil, fmt.Errorf("rls: MaxDescriptors, MaxEntries and MaxRuleValues must not be negative (got %d, %d, %d)", opts.MaxDescriptors, opts.MaxEntries, opts.MaxRuleValues)
	}
	if opts.NearLimitRatio < 0 || opts.NearLimitRatio > 1 {
		return nil, fmt.Errorf("rls: NearLimitRatio must be within [0, 1] (got %v)", opts.NearLimitRatio)
	}
	if opts.NearLimitRatio == 0 {
		opts.NearLimitRatio = DefaultNearLimitRatio
	}
	if opts.MaxRuleValues == 0 {
		opts.MaxRuleValues = DefaultMaxRuleValues
	}
	s := &Service{
		store:          st,
		maxDescriptors: opts.MaxDescriptors,
		maxEntries:     opts.MaxEntries,
		quota:          opts.Quota,
		log:            opts.Logger,
		metrics:        NewMetrics(opts.Registerer),
		rules:          newRuleMetrics(opts.NearLimitRatio, opts.MaxRuleValues),
	}
	if opts.Registerer != nil {
		for _, c := range s.rules.collectors() {
			opts.Registerer.MustRegister(c)
		}
	}
	if s.maxDescriptors == 0 {
		s.maxDescriptors = DefaultMaxDescriptors
	}
	if s.maxEntries == 0 {
		s.maxEntries = DefaultMaxEntries
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	s.SetPolicies(policies)
	return s, nil
}

// SetPolicies replaces the policies whole. Decisions already running finish
// with the set they started with. nil means no policies.
func (s *Service) SetPolicies(p *policy.Set) {
	if p == nil {
		p, _ = policy.NewSet()
	}
	v := newVersion(p, s.rules)
	s.policies.Store(v)
	live := make(map[ruleLabel]bool, len(v.info))
	for l := range v.info {
		live[ruleLabel{l.Domain, l.ID}] = true
	}
	s.rules.prune(func(l *policy.Limit) bool { return v.info[l] != nil },
		func(domain, id string) bool { return live[ruleLabel{domain, id}] })
}

// Policies returns the current policy set.
func (s *Service) Policies() *policy.Set { return s.policies.Load().set }

// Metrics returns the service's collectors.
func (s *Service) Metrics() *Metrics { return s.metrics }

// Register registers the service on a gRPC server.
func (s *Service) Register(r grpc.ServiceRegistrar) { rlsv3.RegisterRateLimitServiceServer(r, s) }

// ShouldRateLimit decides one request. Malformed requests are refused with
// InvalidArgument naming the field; store failures are not errors (see the
// package comment); an error is returned otherwise only when ctx ends.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	start := time.Now()
	resp, err := s.decide(ctx, req)
	s.metrics.Latency.Observe(time.Since(start).Seconds())
	return resp, err
}

// slot is one limit of one descriptor sent to the store.
type slot struct {
	desc     int           // index of the descriptor
	lim      *policy.Limit // the limit
	info     *limitInfo    // what is derived from lim
	tooLarge bool          // the cost exceeds the capacity: peeked, answered over limit
	cost     int64         // the descriptor's cost
	rule     *ruleCounters // the rule's statistics (nil for an override)
}

// outcome is a descriptor's reported limit and its decision.
type outcome struct {
	lim    *policy.Limit     // nil: nothing limits the descriptor
	info   *limitInfo        // what is derived from lim (nil with lim)
	res    algorithms.Result // the decision (times in nanoseconds)
	failed bool              // decided by failure_mode: the store failed
	wait   int64             // the longest wait a reserve limit of the descriptor granted (ns)
}

// over reports whether the outcome is an enforced over-limit.
func (o *outcome) over() bool { return o.lim != nil && !o.res.Allowed && !o.lim.ShadowMode }

// remaining returns what the outcome reports as remaining: 0 when the limit
// refused the request, whatever the limiter could still admit. A refused
// request is not counted (a cost above what remains takes nothing), so the
// limiter may still hold capacity for a cheaper request; but an answer that
// refuses must not invite the same request again (Envoy's
// X-RateLimit-Remaining on a 429 would say "10 left" to a request of cost
// 11 that can never pass). envoyproxy/ratelimit also answers 0 there.
func (o *outcome) remaining() int64 {
	if !o.res.Allowed {
		return 0
	}
	return max(o.res.Remaining, 0)
}

// reset returns the nanoseconds the outcome reports until reset: for an
// allowed request, until the limiter is full again; for a refused one,
// until the same request would be allowed, or, when no wait can make it
// pass (a cost above the limit's capacity), until the limiter is full again.
func (o *outcome) reset() int64 {
	if !o.res.Allowed && o.res.RetryAfter > 0 {
		return o.res.RetryAfter
	}
	return o.res.ResetAfter
}

// decide is ShouldRateLimit without the latency measurement: prepare, one
// store call, finish.
func (s *Service) decide(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	p, err := s.prepare(req)
	if err != nil {
		return nil, err
	}
	sc := p.sc
	defer putScratch(sc)
	var storeErr error
	results := sc.resultsFor(len(sc.checks))
	if len(sc.checks) > 0 {
		storeErr = s.store.Decide(ctx, sc.checks, results)
		if storeErr != nil {
			if err := ctx.Err(); err != nil {
				sc.abandon() // the store may still hold the results slice
				return nil, status.FromContextError(err).Err()
			}
			p.dm.storeErrors.Inc()
			s.logStoreError(p.label, storeErr)
		}
	}
	return s.finish(&p, results, storeErr), nil
}

// pending is a request between prepare and finish: its scratch holds the
// store checks to make (checks, with what each is for in slots).
type pending struct {
	sc    *scratch
	dom   *policy.Domain // nil: a domain without policies
	label string         // the domain's metrics label
	dm    *domainMetrics
	n     int  // descriptors
	quota bool // the caller spends quotas (see QuotaField)
}

// prepare checks req and lists the store checks it needs. On success the
// caller owns p.sc (putScratch once done with the results).
func (s *Service) prepare(req *rlsv3.RateLimitRequest) (p pending, err error) {
	domainName := req.GetDomain()
	descs := req.GetDescriptors()
	switch {
	case domainName == "":
		return p, s.invalid(reasonEmptyDomain, "domain: must not be empty")
	case len(descs) == 0:
		return p, s.invalid(reasonNoDescriptors, "descriptors: must not be empty")
	case len(descs) > s.maxDescriptors:
		return p, s.invalid(reasonTooMany, "descriptors: %d in one request, more than the %d allowed", len(descs), s.maxDescriptors)
	}
	ver := s.policies.Load()
	dom := ver.set.Domain(domainName)
	label := unknownDomain
	if dom != nil {
		label = dom.Name
	}
	dm := s.metrics.domain(label)

	hits := int64(req.GetHitsAddend())
	if hits == 0 {
		hits = 1 // proto3's default, as envoyproxy/ratelimit reads it
	}
	n := len(descs)
	sc := getScratch(n)
	defer func() {
		if err != nil {
			putScratch(sc)
		}
	}()
	costs, outs, unlimited := sc.costs, sc.outs, sc.unlimited
	matched, overrides := sc.matched, sc.overrides // configured limits, per-request override, per descriptor
	for i, d := range descs {
		switch {
		case d == nil:
			return p, s.invalid(reasonNilDescriptor, "descriptors[%d]: must not be null", i)
		case len(d.GetEntries()) > s.maxEntries:
			return p, s.invalid(reasonTooManyEntries, "descriptors[%d].entries: %d entries, more than the %d allowed", i, len(d.GetEntries()), s.maxEntries)
		case d.GetIsNegativeHits():
			return p, s.invalid(reasonNegativeHits, "descriptors[%d].is_negative_hits: not supported: sluice's limiters never give capacity back", i)
		}
		costs[i] = hits
		if h := d.GetHitsAddend(); h != nil {
			costs[i] = int64(min(h.GetValue(), math.MaxInt64))
		}
		if dom == nil {
			continue
		}
		if o := d.GetLimit(); o != nil {
			l, err := overrideLimit(dom, o)
			if err != nil {
				return p, s.invalid(reasonBadOverride, "descriptors[%d].limit.%v", i, err)
			}
			overrides[i] = l
			continue
		}
		sc.pe = sc.pe[:0]
		for _, e := range d.GetEntries() {
			sc.pe = append(sc.pe, policy.Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
		matched[i] = dom.Match(sc.pe)
	}
	if dom != nil {
		dom.DropReplaced(matched)
	}

	// One store check per limit to count.
	checks, slots := sc.checks[:0], sc.slots[:0]
	for i := 0; dom != nil && i < n; i++ {
		ls := matched[i]
		if overrides[i] != nil {
			ls = overrides[i : i+1]
		}
		keyed := false
		for _, l := range ls {
			switch {
			case l.Unlimited:
				unlimited[i] = true
				continue
			case l.Requests == 0: // an override of 0: nothing is admitted
				outs[i] = outcome{lim: l, info: ver.infoOf(l)}
				dm.overLimit.Inc()
				continue
			}
			if !keyed {
				sc.entries = storeEntries(sc.entries[:0], descs[i])
				for j, v := range l.SharedValues { // share_threshold: one counter for the wildcard
					if v != "" && j < len(sc.entries) {
						sc.entries[j].Value = v
					}
				}
				keyed = true
			}
			info := ver.infoOf(l)
			cost, tooLarge := costs[i], costs[i] > info.capacity
			if tooLarge {
				cost = 0 // peek, to report the limit's state
			}
			checks = append(checks, store.Check{Key: store.Key(dom.Name, sc.entries, l.ID, info.store.Algorithm), Limit: info.store, Cost: cost})
			rule := info.counters(l, descs[i].GetEntries())
			slots = append(slots, slot{desc: i, lim: l, info: info, tooLarge: tooLarge, cost: costs[i], rule: rule})
		}
	}
	sc.checks, sc.slots = checks, slots
	return pending{sc: sc, dom: dom, label: label, dm: dm, n: n, quota: acceptsQuota(req)}, nil
}

// finish builds the response of p from the store's results for its checks
// (or storeErr, which the failure modes answer).
func (s *Service) finish(p *pending, results []algorithms.Result, storeErr error) *rlsv3.RateLimitResponse {
	sc, dom, dm, n := p.sc, p.dom, p.dm, p.n
	outs, unlimited, slots := sc.outs, sc.unlimited, sc.slots
	for k := range slots {
		sl := &slots[k]
		o := outcome{lim: sl.lim, info: sl.info}
		switch {
		case storeErr != nil:
			o.failed = true
			o.res = algorithms.Result{Allowed: true, Limit: sl.info.capacity}
			if sl.lim.FailureMode == policy.FailClosed {
				o.res.Allowed, o.res.RetryAfter = false, int64(FailureRetryAfter)
				dm.failClosed.Inc()
			} else {
				dm.failOpen.Inc()
			}
		case sl.tooLarge:
			o.res = results[k]
			o.res.Allowed, o.res.RetryAfter = false, 0
		default:
			o.res = results[k]
		}
		if !o.failed {
			sl.rule.record(s.rules.nearRatio, sl.info.capacity, sl.cost, &o.res, sl.lim.ShadowMode)
		}
		if !o.res.Allowed && !o.failed {
			if sl.lim.ShadowMode {
				dm.shadow.Inc()
			} else {
				dm.overLimit.Inc()
			}
		}
		cur := &outs[sl.desc]
		wait := cur.wait
		if o.res.Allowed && !o.failed && !sl.lim.ShadowMode {
			wait = max(wait, o.res.Wait) // the request waits for the last of its slots
		}
		if cur.lim == nil || moreRestrictive(&o, cur) {
			*cur = o
		}
		cur.wait = wait
	}

	resp := newResponse(n)
	for i := range outs {
		o := &outs[i]
		st := resp.Statuses[i]
		st.Code = rlsv3.RateLimitResponse_OK
		switch {
		case o.lim != nil:
			st.CurrentLimit = o.info.current
			st.LimitRemaining = uint32(min(o.remaining(), math.MaxUint32))
			setSeconds(st.DurationUntilReset, o.reset())
			if o.over() {
				st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
				resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
			}
		case unlimited[i]:
			st.DurationUntilReset = nil
			st.LimitRemaining = math.MaxUint32
		default:
			st.DurationUntilReset = nil
		}
	}
	if dom != nil && dom.ResponseHeaders {
		resp.ResponseHeadersToAdd = rateLimitHeaders(outs, resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT)
	}
	s.addQuotas(p, resp, storeErr)
	resp.DynamicMetadata = limitMetadata(outs)
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		dm.overLimitCode.Inc()
	} else {
		dm.ok.Inc()
	}
	return resp
}

// moreRestrictive reports whether a should be reported instead of b: an
// over-limit before an allowed one, the longer wait among over-limits, the
// fewer remaining (then the later reset) among allowed ones.
func moreRestrictive(a, b *outcome) bool {
	switch {
	case a.res.Allowed != b.res.Allowed:
		return !a.res.Allowed
	case !a.res.Allowed:
		return a.res.RetryAfter > b.res.RetryAfter
	case a.res.Remaining != b.res.Remaining:
		return a.res.Remaining < b.res.Remaining
	}
	return a.res.ResetAfter > b.res.ResetAfter
}

// invalid counts and returns an InvalidArgument error.
func (s *Service) invalid(reason, format string, args ...any) error {
	s.metrics.Invalid.WithLabelValues(reason).Inc()
	return status.Errorf(codes.InvalidArgument, format, args...)
}

// logStoreError logs a store error, at most once a second.
func (s *Service) logStoreError(domain string, err error) {
	now := time.Now().UnixNano()
	last := s.lastErrLog.Load()
	if now-last < int64(time.Second) || !s.lastErrLog.CompareAndSwap(last, now) {
		return
	}
	s.log.Warn("store failed: limits follow their failure_mode", "store", s.store.Name(), "domain", domain, "error", err.Error())
}

// storeEntries appends a descriptor's entries, for store.Key, to buf.
func storeEntries(buf []store.Entry, d *ratelimitv3.RateLimitDescriptor) []store.Entry {
	for _, e := range d.GetEntries() {
		buf = append(buf, store.Entry{Key: e.GetKey(), Value: e.GetValue()})
	}
	return buf
}

// storeAlgorithms maps policy algorithms to the store's.
var storeAlgorithms = map[policy.Algorithm]store.Algorithm{
	policy.FixedWindow:   store.FixedWindow,
	policy.SlidingWindow: store.SlidingWindow,
	policy.SlidingLog:    store.SlidingLog,
	policy.TokenBucket:   store.TokenBucket,
	policy.GCRA:          store.GCRA,
	policy.Reserve:       store.Reserve,
}

// storeLimit returns what the store needs to know of l.
func storeLimit(l *policy.Limit) store.Limit {
	return store.Limit{Algorithm: storeAlgorithms[l.Algorithm], Requests: l.Requests, Window: l.Window, Burst: l.Burst, MaxWait: l.MaxWait, Lease: l.Lease}
}

// capacity returns the most a limit admits at one instant: the largest
// cost it can ever allow.
func capacity(l store.Limit) int64 {
	if (l.Algorithm == store.TokenBucket || l.Algorithm == store.GCRA || l.Algorithm == store.Reserve) && l.Burst > 0 {
		return l.Burst
	}
	return l.Requests
}

// overrideUnits maps the override units to their length. The numeric values
// of typev3.RateLimitUnit equal those of the RLS response enum.
var overrideUnits = map[typev3.RateLimitUnit]time.Duration{
	typev3.RateLimitUnit_SECOND: time.Second,
	typev3.RateLimitUnit_MINUTE: time.Minute,
	typev3.RateLimitUnit_HOUR:   time.Hour,
	typev3.RateLimitUnit_DAY:    24 * time.Hour,
	typev3.RateLimitUnit_MONTH:  30 * 24 * time.Hour,
	typev3.RateLimitUnit_YEAR:   365 * 24 * time.Hour,
}

// overridePrefix starts the ID of an override limit. Configured limit IDs
// escape '%' (policy.Limit.ID), so no configured ID starts with "%o".
const overridePrefix = "%override/"

// overrideLimit returns the fixed-window limit a descriptor's limit override
// asks for. As in envoyproxy/ratelimit, the counter is keyed by the window
// (not requests_per_unit), so changing the number keeps the count. The error
// names the field under "limit.".
func overrideLimit(dom *policy.Domain, o *ratelimitv3.RateLimitDescriptor_RateLimitOverride) (*policy.Limit, error) {
	unit, ok := overrideUnits[o.GetUnit()]
	if !ok {
		return nil, fmt.Errorf("unit: %v is not a unit (use SECOND, MINUTE, HOUR, DAY, MONTH or YEAR)", o.GetUnit())
	}
	mult := uint32(1)
	if m := o.GetUnitMultiplier(); m != nil {
		if m.GetValue() == 0 {
			return nil, fmt.Errorf("unit_multiplier: must be at least 1")
		}
		mult = m.GetValue()
	}
	if time.Duration(mult) > maxWindow/unit {
		return nil, fmt.Errorf("unit_multiplier: %d %v is too long a window (at most %v)", mult, o.GetUnit(), maxWindow)
	}
	w := unit * time.Duration(mult)
	u := policy.Unit(o.GetUnit())
	if mult != 1 {
		u = policy.UnitUnknown
	}
	return &policy.Limit{
		Algorithm:   policy.FixedWindow,
		Requests:    int64(o.GetRequestsPerUnit()),
		Window:      w,
		Unit:        u,
		FailureMode: dom.FailureMode,
		ID:          fmt.Sprintf("%s%v*%d", overridePrefix, o.GetUnit(), mult),
		Domain:      dom.Name,
	}, nil
}
