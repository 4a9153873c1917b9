package rls

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/controlplane/calendar"
	"github.com/sluicehq/sluice/controlplane/policy"
	"github.com/sluicehq/sluice/controlplane/store"
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
	// maxWindow bounds override windows as package algorithms bounds spans.
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
	// ChargePastLimit makes every limit charge a request's cost even when
	// it does not fit, as a descriptor's charge_past_limit does for its
	// own limits: for configurations that cannot carry the policy field
	// (Envoy Gateway's over xDS). Refused requests then count, as
	// envoyproxy/ratelimit counts every hit. See docs/usage-based.md.
	ChargePastLimit bool
	// QuotaMode puts every descriptor in quota mode (envoyproxy/ratelimit's
	// QUOTA_MODE): a request is over limit only when all of them are.
	QuotaMode bool
	// CalendarMonths, when set, makes every limit of one month (unit:
	// month, or a request's override of unit MONTH) of fixed_window,
	// sliding_window or sliding_log that has no calendar of its own count
	// this calendar's months (envoyproxy/ratelimit's
	// USE_CALENDAR_MONTH_RATE_LIMIT: UTC months). Other limits keep theirs.
	CalendarMonths *calendar.Calendar
	// ResponseMetadata adds envoyproxy/ratelimit's dynamic metadata to
	// every answer (its RESPONSE_DYNAMIC_METADATA; see responseMetadata).
	ResponseMetadata bool
	// SettleTokens bounds the settlement tokens this service has the
	// store remember within SettleTTL, shared fairly among its clients
	// (see tokenBudget); 0 means DefaultSettleTokens.
	SettleTokens int64
	// SettleTTL is the store's dedupe TTL; 0 means DefaultSettleTTL.
	SettleTTL time.Duration
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
	tokens         *tokenBudget // settlement tokens

	chargePastLimit  bool               // Options.ChargePastLimit
	quotaMode        bool               // Options.QuotaMode
	months           *calendar.Calendar // Options.CalendarMonths
	responseMetadata bool               // Options.ResponseMetadata
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
	if !(opts.NearLimitRatio >= 0 && opts.NearLimitRatio <= 1) { // NaN too
		return nil, fmt.Errorf("rls: NearLimitRatio must be within [0, 1] (got %v)", opts.NearLimitRatio)
	}
	if opts.NearLimitRatio == 0 {
		opts.NearLimitRatio = DefaultNearLimitRatio
	}
	if opts.SettleTokens < 0 || opts.SettleTTL < 0 {
		return nil, fmt.Errorf("rls: SettleTokens and SettleTTL must not be negative (got %d, %v)", opts.SettleTokens, opts.SettleTTL)
	}
	if opts.SettleTokens == 0 {
		opts.SettleTokens = DefaultSettleTokens
	}
	if opts.SettleTTL == 0 {
		opts.SettleTTL = DefaultSettleTTL
	}
	if opts.MaxRuleValues == 0 {
		opts.MaxRuleValues = DefaultMaxRuleValues
	}
	s := &Service{
		store:          st,
		maxDescriptors: opts.MaxDescriptors,
		maxEntries:     opts.MaxEntries,
		quota:          opts.Quota,

		chargePastLimit:  opts.ChargePastLimit,
		quotaMode:        opts.QuotaMode,
		months:           opts.CalendarMonths,
		responseMetadata: opts.ResponseMetadata,
		log:              opts.Logger,
		metrics:          NewMetrics(opts.Registerer),
		rules:            newRuleMetrics(opts.NearLimitRatio, opts.MaxRuleValues),
		tokens:           newTokenBudget(opts.SettleTokens, opts.SettleTTL),
	}
	if opts.Registerer != nil {
		for _, c := range s.rules.collectors() {
			opts.Registerer.MustRegister(c)
		}
		opts.Registerer.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_settle_tokens",
			Help: "Settlement tokens this replica has had the store remember within the dedupe TTL (at most -settle-max-tokens).",
		}, func() float64 { return float64(s.tokens.live()) }))
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
	v := newVersion(p, s.rules, s.months)
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
//
// A call whose gRPC metadata (grpc-go's incoming context) holds
// x-sluice-settle is a settlement (see SettleHeader).
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	var settle []string
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		settle = md.Get(SettleHeader)
	}
	return s.shouldRateLimit(ctx, req, settle)
}

// shouldRateLimit is ShouldRateLimit with the call's x-sluice-settle values
// (nil: none).
func (s *Service) shouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest, settle []string) (*rlsv3.RateLimitResponse, error) {
	start := time.Now()
	resp, err := s.decide(ctx, req, settle)
	s.metrics.Latency.Observe(time.Since(start).Seconds())
	return resp, err
}

// decide is ShouldRateLimit without the latency measurement: prepare, one
// store call, finish.
func (s *Service) decide(ctx context.Context, req *rlsv3.RateLimitRequest, settle []string) (*rlsv3.RateLimitResponse, error) {
	p, err := s.prepare(req, settle)
	if err == nil {
		err = s.takeTokens(ctx, &p)
	}
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
			if p.onces != nil {
				return nil, errSettleUndecided
			}
		}
	}
	return s.finish(&p, results, storeErr), nil
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
