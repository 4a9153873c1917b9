package rlqs

import (
	"context"
	"math"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/controlplane/policy"
	"github.com/sluicehq/sluice/controlplane/store"
	"github.com/sluicehq/sluice/shared/algorithms"
)

// assign decides the action for one bucket of st after a report.
func (s *Service) assign(ctx context.Context, st *stream, b *bucket, demand float64, allowed int64, now time.Time) *rlqspb.RateLimitQuotaResponse_BucketAction {
	dom := s.policies.Load().Domain(st.domain)
	limits, shadow := counted(dom, b.entries)
	if len(limits) == 0 {
		b.hadLimit = false
		b.sent = TokenBucket{}
		s.m.actions.WithLabelValues("allow_all").Inc()
		return s.blanket(b, typev3.RateLimitStrategy_ALLOW_ALL)
	}
	b.hadLimit = true
	// The binding limit: the smallest rate.
	bind := limits[0]
	for _, l := range limits[1:] {
		if rateOf(l) < rateOf(bind) {
			bind = l
		}
	}
	spent := s.debit(ctx, dom.Name, b.entries, limits, allowed)
	b.demandKey = demandKey(dom.Name, b.entries, bind)
	var tb TokenBucket
	var share float64
	decide := func(all map[string]Envoy) float64 {
		tb, share = TokenBucket{}, 0
		if !shadow && !spent {
			share = Allot(rateOf(bind), all, st.id, s.opts.Headroom, s.opts.Floor)
			if b.sent.TokensPerFill == 0 {
				// Envoy starts it full: until the next report it
				// admits up to the share, burst included
				tb = StartBucketFor(share, ReportInterval)
				return share
			}
			tb = BucketFor(share)
		}
		return tb.Rate()
	}
	if _, err := s.demand.Assign(ctx, b.demandKey, st.id, demand, now, s.opts.TTL, decide); err != nil {
		s.m.demandErrors.Inc()
		s.log.Debug("rlqs: shared demand unavailable: sizing from this replica's Envoys", "error", err.Error())
		s.local.Assign(ctx, b.demandKey, st.id, demand, now, s.opts.TTL, decide)
	}
	s.log.Debug("rlqs: assignment", "domain", dom.Name, "limit", bind.ID, "envoy", st.id, "demand", demand,
		"share", share, "tokens_per_fill", tb.TokensPerFill, "fill_interval", tb.FillInterval.String(), "budget_spent", spent)
	switch {
	case shadow:
		b.sent = TokenBucket{}
		s.m.actions.WithLabelValues("allow_all").Inc()
		return s.blanket(b, typev3.RateLimitStrategy_ALLOW_ALL)
	case tb.TokensPerFill == 0:
		b.sent = TokenBucket{}
		s.m.actions.WithLabelValues("deny_all").Inc()
		return s.blanket(b, typev3.RateLimitStrategy_DENY_ALL)
	}
	tb = tb.distinctFrom(b.sent)
	b.sent = tb
	s.m.actions.WithLabelValues("token_bucket").Inc()
	return s.quota(b, &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens:     tb.MaxTokens,
		TokensPerFill: wrapperspb.UInt32(tb.TokensPerFill),
		FillInterval:  durationpb.New(tb.FillInterval),
	}}})
}

// counted returns the limits that count for a descriptor, and whether they
// are all in shadow mode. An unlimited limit, or none, means nothing is
// counted.
func counted(dom *policy.Domain, entries []store.Entry) ([]*policy.Limit, bool) {
	if dom == nil {
		return nil, false
	}
	pe := make([]policy.Entry, len(entries))
	for i, e := range entries {
		pe[i] = policy.Entry{Key: e.Key, Value: e.Value}
	}
	matched := dom.DropReplaced([][]*policy.Limit{dom.Match(pe)})[0]
	var out []*policy.Limit
	shadow := true
	for _, l := range matched {
		if l.Unlimited {
			return nil, false
		}
		if l.Requests <= 0 || l.Window <= 0 {
			continue
		}
		out = append(out, l)
		shadow = shadow && l.ShadowMode
	}
	return out, shadow
}

// rateOf returns a limit's rate in requests per second.
func rateOf(l *policy.Limit) float64 { return float64(l.Requests) / l.Window.Seconds() }

// usageLimit is the store limit RLQS usage is debited from: a token bucket
// refilled at l's rate, holding budgetTime of it.
func usageLimit(l *policy.Limit) store.Limit {
	burst := int64(math.Ceil(rateOf(l) * budgetTime.Seconds()))
	return store.Limit{Algorithm: store.TokenBucket, Requests: l.Requests, Window: l.Window, Burst: max(burst, 1)}
}

// usageKey is the store key of l's usage bucket for one descriptor.
func usageKey(domain string, entries []store.Entry, l *policy.Limit) string {
	return store.Key(domain, entries, l.ID+"@rlqs", store.TokenBucket)
}

// demandKey is where the Envoys' demand for one descriptor's limit lives.
func demandKey(domain string, entries []store.Entry, l *policy.Limit) string {
	return "sluice:rlqs:" + usageKey(domain, entries, l)
}

// debit counts allowed requests against each limit's usage bucket in the
// store, and reports whether one of them was already spent. A store
// failure spends nothing: assignments then come from the demand alone.
func (s *Service) debit(ctx context.Context, domain string, entries []store.Entry, limits []*policy.Limit, allowed int64) bool {
	checks := make([]store.Check, len(limits))
	for i, l := range limits {
		ul := usageLimit(l)
		checks[i] = store.Check{Key: usageKey(domain, entries, l), Limit: ul, Cost: min(allowed, ul.Burst)}
	}
	results := make([]algorithms.Result, len(checks))
	if err := s.store.Decide(ctx, checks, results); err != nil {
		s.m.storeErrors.Inc()
		return false
	}
	for _, r := range results {
		if !r.Allowed {
			return true
		}
	}
	return false
}

// blanket returns a blanket-rule assignment for b.
func (s *Service) blanket(b *bucket, rule typev3.RateLimitStrategy_BlanketRule) *rlqspb.RateLimitQuotaResponse_BucketAction {
	return s.quota(b, &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: rule}})
}

// quota returns an assignment of strategy to b, valid for the TTL.
func (s *Service) quota(b *bucket, strategy *typev3.RateLimitStrategy) *rlqspb.RateLimitQuotaResponse_BucketAction {
	return &rlqspb.RateLimitQuotaResponse_BucketAction{
		BucketId: b.id,
		BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
			QuotaAssignmentAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: durationpb.New(s.opts.TTL),
				RateLimitStrategy:    strategy,
			},
		},
	}
}
