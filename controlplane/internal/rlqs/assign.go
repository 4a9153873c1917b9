package rlqs

import (
	"context"
	"math"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/policy"
	"github.com/sluicehq/sluice/controlplane/store"
)

// assign decides the action for one bucket of st after a report whose
// usage is allowed requests; id is the bucket's id as reported.
func (s *Service) assign(ctx context.Context, st *stream, b *bucket, id *rlqspb.BucketId, demand float64, allowed int64, now time.Time) *rlqspb.RateLimitQuotaResponse_BucketAction {
	dom := s.policies.Load().Domain(st.domain)
	limits, shadow := counted(dom, b.entries)
	if len(limits) == 0 {
		b.hadLimit = false
		b.sent = TokenBucket{}
		s.m.actions.WithLabelValues("allow_all").Inc()
		return s.blanket(id, typev3.RateLimitStrategy_ALLOW_ALL)
	}
	b.hadLimit = true
	// The binding limit: the smallest rate.
	bind := limits[0]
	for _, l := range limits[1:] {
		if rateOf(l) < rateOf(bind) {
			bind = l
		}
	}
	// A loan's usage was charged when it was lent.
	spent, room := s.debit(ctx, dom.Name, b.entries, limits, max(allowed-b.prepaid, 0))
	b.prepaid = 0
	b.demandKey = demandKey(dom.Name, b.entries, bind)
	// Envoy starts a token bucket full when the assignment in force is not
	// one (none yet, a blanket rule, an expired one): until the next report
	// it admits up to the share, burst included.
	first := b.sent.TokensPerFill == 0
	bucketOf := func(share float64) TokenBucket {
		if first {
			return StartBucketFor(share, ReportInterval)
		}
		return BucketFor(share)
	}
	// What the usage budget left can lend over one report interval.
	lendable := float64(room) / ReportInterval.Seconds()
	var tb TokenBucket
	var share, lent float64
	decide := func(all map[string]Envoy) float64 {
		tb, share, lent = TokenBucket{}, 0, 0
		if shadow || spent {
			return 0
		}
		share, lent = Grant(rateOf(bind), all, st.id, s.opts.Headroom, s.opts.Floor, lendable)
		tb = bucketOf(share)
		switch {
		case tb.TokensPerFill == 0:
			lent = 0
			return 0
		case first:
			return share
		}
		return tb.Rate()
	}
	if _, err := s.demand.Assign(ctx, b.demandKey, st.id, demand, now, s.opts.TTL, decide); err != nil {
		s.m.demandErrors.Inc()
		s.log.Debug("rlqs: shared demand unavailable: sizing from this replica's Envoys", "error", err.Error())
		s.local.Assign(ctx, b.demandKey, st.id, demand, now, s.opts.TTL, decide)
	}
	if lent > 0 {
		// The loan is charged now, so that loans only come out of room
		// the budget has; the Envoy's next report is charged the rest.
		s.m.loans.Inc()
		b.prepaid = s.prepay(ctx, dom.Name, b.entries, limits, int64(math.Ceil(lent*ReportInterval.Seconds())))
	}
	s.log.Debug("rlqs: assignment", "domain", dom.Name, "limit", bind.ID, "envoy", st.id, "demand", demand,
		"share", share, "lent", lent, "tokens_per_fill", tb.TokensPerFill, "fill_interval", tb.FillInterval.String(), "budget_spent", spent)
	switch {
	case shadow:
		b.sent = TokenBucket{}
		s.m.actions.WithLabelValues("allow_all").Inc()
		return s.blanket(id, typev3.RateLimitStrategy_ALLOW_ALL)
	case tb.TokensPerFill == 0:
		b.sent = TokenBucket{}
		s.m.actions.WithLabelValues("deny_all").Inc()
		return s.blanket(id, typev3.RateLimitStrategy_DENY_ALL)
	}
	tb = tb.distinctFrom(b.sent)
	b.sent = tb
	s.m.actions.WithLabelValues("token_bucket").Inc()
	return s.quota(id, &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
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
	return store.Limit{Algorithm: algorithms.KindTokenBucket, Requests: l.Requests, Window: l.Window, Burst: max(burst, 1)}
}

// usageKey is the store key of l's usage bucket for one descriptor.
func usageKey(domain string, entries []store.Entry, l *policy.Limit) string {
	return store.Key(domain, entries, l.ID+"@rlqs", algorithms.KindTokenBucket)
}

// demandKey is where the Envoys' demand for one descriptor's limit lives.
func demandKey(domain string, entries []store.Entry, l *policy.Limit) string {
	return "sluice:rlqs:" + usageKey(domain, entries, l)
}

// debit takes usage (requests already admitted) from each limit's usage
// bucket in the store, and reports whether one of them was spent (the
// usage did not fit: it takes nothing then) and the budget left (the
// smallest remaining of the buckets). A store failure spends nothing:
// assignments then come from the demand alone, without loans.
func (s *Service) debit(ctx context.Context, domain string, entries []store.Entry, limits []*policy.Limit, usage int64) (spent bool, room int64) {
	results, ok := s.take(ctx, domain, entries, limits, usage)
	if !ok {
		return false, 0
	}
	room = math.MaxInt64
	for _, r := range results {
		spent = spent || !r.Allowed
		room = min(room, r.Remaining)
	}
	return spent, room
}

// take takes usage from each limit's usage bucket (at most its
// capacity), and reports whether the store answered.
func (s *Service) take(ctx context.Context, domain string, entries []store.Entry, limits []*policy.Limit, usage int64) ([]algorithms.Result, bool) {
	checks := make([]store.Check, len(limits))
	for i, l := range limits {
		ul := usageLimit(l)
		checks[i] = store.Check{Key: usageKey(domain, entries, l), Limit: ul, Cost: min(usage, ul.Burst)}
	}
	results := make([]algorithms.Result, len(checks))
	if err := s.store.Decide(ctx, checks, results); err != nil {
		s.m.storeErrors.Inc()
		return nil, false
	}
	return results, true
}

// prepay takes a loan's usage over one report interval from the usage
// buckets, and returns what it took (0 if the budget no longer had room
// or the store failed).
func (s *Service) prepay(ctx context.Context, domain string, entries []store.Entry, limits []*policy.Limit, usage int64) int64 {
	results, ok := s.take(ctx, domain, entries, limits, usage)
	for _, r := range results {
		ok = ok && r.Allowed
	}
	if !ok {
		return 0
	}
	return usage
}

// blanket returns a blanket-rule assignment for the bucket id.
func (s *Service) blanket(id *rlqspb.BucketId, rule typev3.RateLimitStrategy_BlanketRule) *rlqspb.RateLimitQuotaResponse_BucketAction {
	return s.quota(id, &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: rule}})
}

// quota returns an assignment of strategy to the bucket id, valid for the
// TTL.
func (s *Service) quota(id *rlqspb.BucketId, strategy *typev3.RateLimitStrategy) *rlqspb.RateLimitQuotaResponse_BucketAction {
	return &rlqspb.RateLimitQuotaResponse_BucketAction{
		BucketId: id,
		BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
			QuotaAssignmentAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: durationpb.New(s.opts.TTL),
				RateLimitStrategy:    strategy,
			},
		},
	}
}
