// One decision: the store checks a request needs (prepare) and the answer
// built from their results (finish).

package rls

import (
	"math"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/policy"
	"github.com/sluicehq/sluice/controlplane/store"
)

// slot is one limit of one descriptor sent to the store.
type slot struct {
	desc     int           // index of the descriptor
	lim      *policy.Limit // the limit
	info     *limitInfo    // what is derived from lim
	tooLarge bool          // the cost exceeds the capacity: peeked, answered over limit
	refund   bool          // the descriptor gives its cost back (is_negative_hits): answered OK
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

// pending is a request between prepare and finish: its scratch holds the
// store checks to make (checks, with what each is for in slots).
type pending struct {
	sc     *scratch
	dom    *policy.Domain // nil: a domain without policies
	label  string         // the domain's metrics label
	dm     *domainMetrics
	n      int    // descriptors
	caller uint64 // the caller spending quotas, 0 if it spends none (see QuotaField)
	req    *rlsv3.RateLimitRequest
	onces  []store.Once // a settlement's: per check (see attachOnce); nil otherwise
	grant  settleGrant  // what a settlement took from the token budget
}

// prepare checks req and lists the store checks it needs. settle holds the
// call's x-sluice-settle values: nil for a decision, else the call is a
// settlement (see settle.go). On success the caller owns p.sc (putScratch
// once done with the results).
func (s *Service) prepare(req *rlsv3.RateLimitRequest, settle []string) (p pending, err error) {
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
	var token string
	if settle != nil {
		if token, err = s.checkSettle(settle, len(descs)); err != nil {
			return p, err
		}
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
			refund := descs[i].GetIsNegativeHits()
			cost, mode, tooLarge := s.checkCost(l, info, costs[i])
			switch {
			case refund:
				// Given back whatever its size (the stores clamp it at
				// the most a limiter holds), once per token in a
				// settlement.
				cost, mode, tooLarge = costs[i], store.Refund, false
			case settle != nil:
				cost, mode = settleCost(costs[i])
				tooLarge = false // charged whatever its size
			}
			checks = append(checks, store.Check{Key: store.Key(dom.Name, sc.entries, l.ID, info.store.Algorithm), Limit: info.store, Cost: cost, Mode: mode})
			var rule *ruleCounters
			if !refund { // a refund is no hit
				rule = info.counters(l, descs[i].GetEntries())
			}
			slots = append(slots, slot{desc: i, lim: l, info: info, tooLarge: tooLarge, refund: refund, cost: costs[i], rule: rule})
		}
	}
	sc.checks, sc.slots = checks, slots
	var onces []store.Once
	if settle != nil {
		onces = attachOnce(token, checks, slots)
	}
	return pending{sc: sc, dom: dom, label: label, dm: dm, n: n, caller: quotaCaller(req), req: req, onces: onces}, nil
}

// checkCost returns what the store is asked for one limit of a descriptor
// whose cost (hits_addend) is cost (see docs/usage-based.md):
//
//   - cost 0 probes: nothing is taken, and the request is refused when
//     nothing remains (not even 1);
//   - on a charge_past_limit limit (or every limit, with
//     Options.ChargePastLimit) a cost is charged: taken even past the limit,
//     because the usage already happened;
//   - otherwise the cost is taken if it fits; a cost above the limit's
//     capacity, which could never fit, only peeks (tooLarge: the answer is
//     over limit).
func (s *Service) checkCost(l *policy.Limit, info *limitInfo, cost int64) (c int64, mode store.Mode, tooLarge bool) {
	switch {
	case cost == 0:
		return 0, store.Probe, false
	case l.ChargePastLimit || s.chargePastLimit:
		return cost, store.Charge, false
	case cost > info.capacity:
		return 0, store.Take, true
	}
	return cost, store.Take, false
}

// finish builds the response of p from the store's results for its checks
// (or storeErr, which the failure modes answer).
func (s *Service) finish(p *pending, results []algorithms.Result, storeErr error) *rlsv3.RateLimitResponse {
	sc, dom, dm, n := p.sc, p.dom, p.dm, p.n
	outs, unlimited, slots := sc.outs, sc.unlimited, sc.slots
	if p.onces != nil && storeErr == nil {
		s.countSettled(p)
	}
	for k := range slots {
		sl := &slots[k]
		o := outcome{lim: sl.lim, info: sl.info}
		switch {
		case storeErr != nil:
			o.failed = true
			o.res = algorithms.Result{Allowed: true, Limit: sl.info.capacity}
			if sl.lim.FailureMode == policy.FailClosed && !sl.refund { // a refund refuses nothing
				o.res.Allowed, o.res.RetryAfter = false, int64(FailureRetryAfter)
				dm.failClosed.Inc()
			} else {
				dm.failOpen.Inc()
			}
		case sl.tooLarge:
			o.res = results[k]
			o.res.Allowed, o.res.RetryAfter = false, 0
		case sl.refund:
			// A refund answers OK with what the key holds after it, as
			// envoyproxy/ratelimit does, also while the key is still past
			// its limit (remaining 0 then).
			o.res = results[k]
			o.res.Allowed, o.res.RetryAfter = true, 0
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
	var quotas, quotasOver int // quota-mode descriptors, and those over limit
	rateOver := false          // a descriptor not in quota mode is over limit
	for i := range outs {
		o := &outs[i]
		st := resp.Statuses[i]
		st.Code = rlsv3.RateLimitResponse_OK
		quota := !unlimited[i] && (s.quotaMode || (o.lim != nil && o.lim.QuotaMode))
		if quota {
			quotas++
		}
		switch {
		case o.lim != nil:
			st.CurrentLimit = o.info.current
			st.LimitRemaining = uint32(min(o.remaining(), math.MaxUint32))
			setSeconds(st.DurationUntilReset, o.reset())
			if o.over() {
				st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
				if quota {
					quotasOver++
				} else {
					rateOver = true
				}
			}
		case unlimited[i]:
			st.DurationUntilReset = nil
			st.LimitRemaining = math.MaxUint32
		default:
			st.DurationUntilReset = nil
		}
	}
	// As envoyproxy/ratelimit: over limit when a descriptor not in quota
	// mode is, or when every quota-mode descriptor is.
	if rateOver || (quotas > 0 && quotasOver == quotas) {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if dom != nil && dom.ResponseHeaders {
		resp.ResponseHeadersToAdd = rateLimitHeaders(outs, resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT)
	}
	s.addQuotas(p, resp, storeErr)
	resp.DynamicMetadata = limitMetadata(outs)
	if s.responseMetadata {
		resp.DynamicMetadata = responseMetadata(p.req, outs, unlimited, resp.DynamicMetadata)
	}
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
