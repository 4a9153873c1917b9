package rls

import (
	"strings"
	"sync"
	"sync/atomic"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/policy"
)

// DefaultNearLimitRatio is the share of a limit past which admitted hits
// also count as near the limit: envoyproxy/ratelimit's NEAR_LIMIT_RATIO.
const DefaultNearLimitRatio = 0.8

// DefaultMaxRuleValues is how many request values one detailed_metric or
// value_to_metric rule may label before the rest share the label
// "<rule>@_other".
const DefaultMaxRuleValues = 100

// maxValueLabel is the longest request-value part of a rule label; longer
// ones are cut.
const maxValueLabel = 128

// otherValues is the value part of the label that values past the cap share.
const otherValues = "_other"

// ruleMetrics are envoyproxy/ratelimit's per-rule statistics (total_hits,
// over_limit, near_limit, within_limit, shadow_mode) as Prometheus counters
// labelled by domain and rule. A rule is one configured limit, labelled by
// its ID (the descriptor path and index, e.g. "user=alice/path#0"). A rule
// with detailed_metric or value_to_metric is labelled per request value as
// well ("user#0@user=bob"), up to maxValues values, so a hostile client
// cannot grow the label set.
//
// A rule's series are made when a request first checks it, not when its
// policy is installed: a policy of 10,000 limits costs no series (about
// 2.5 KB of memory each, five per rule) for the rules nobody hits. The
// series of rules a new policy set no longer holds are deleted (prune).
type ruleMetrics struct {
	totalHits, overLimit, nearLimit, withinLimit, shadowMode *prometheus.CounterVec

	nearRatio float64
	maxValues int

	mu     sync.Mutex
	values map[*policy.Limit]map[string]*ruleCounters // per-value counters of detailed rules
	made   map[ruleLabel]ruleLabel                    // every label given series -> its rule's (domain, limit ID)
}

// ruleLabel is the labels of one rule's series.
type ruleLabel struct{ domain, rule string }

// ruleCounters are one rule label's counters, resolved once.
type ruleCounters struct {
	total, over, near, within, shadow prometheus.Counter
}

func newRuleMetrics(nearRatio float64, maxValues int) *ruleMetrics {
	vec := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"domain", "rule"})
	}
	return &ruleMetrics{
		totalHits:   vec("sluice_rule_total_hits_total", "Hits (request costs) checked against the rule: envoyproxy/ratelimit's total_hits."),
		overLimit:   vec("sluice_rule_over_limit_total", "Hits the rule found over its limit: envoyproxy/ratelimit's over_limit."),
		nearLimit:   vec("sluice_rule_near_limit_total", "Admitted hits past the near-limit ratio of the rule's limit: envoyproxy/ratelimit's near_limit."),
		withinLimit: vec("sluice_rule_within_limit_total", "Hits the rule admitted: envoyproxy/ratelimit's within_limit."),
		shadowMode:  vec("sluice_rule_shadow_mode_total", "Hits a shadow_mode rule found over its limit and answered OK: envoyproxy/ratelimit's shadow_mode."),
		nearRatio:   nearRatio,
		maxValues:   maxValues,
		values:      map[*policy.Limit]map[string]*ruleCounters{},
		made:        map[ruleLabel]ruleLabel{},
	}
}

func (m *ruleMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.totalHits, m.overLimit, m.nearLimit, m.withinLimit, m.shadowMode}
}

// counters returns the counters of one label of the rule l, making its
// series if need be. m.mu must be held.
func (m *ruleMetrics) counters(l *policy.Limit, rule string) *ruleCounters {
	domain := l.Domain
	m.made[ruleLabel{domain, rule}] = ruleLabel{domain, l.ID}
	return &ruleCounters{
		total:  m.totalHits.WithLabelValues(domain, rule),
		over:   m.overLimit.WithLabelValues(domain, rule),
		near:   m.nearLimit.WithLabelValues(domain, rule),
		within: m.withinLimit.WithLabelValues(domain, rule),
		shadow: m.shadowMode.WithLabelValues(domain, rule),
	}
}

// perValue reports whether l's metrics are labelled per request value.
func perValue(l *policy.Limit) bool { return l.DetailedMetric || l.ValueToMetric }

// forValue returns the counters of a detailed rule for the request entries
// d: one label per distinct value up to maxValues, then "<rule>@_other".
func (m *ruleMetrics) forValue(l *policy.Limit, entries []*ratelimitv3.RateLimitDescriptor_Entry) *ruleCounters {
	var b strings.Builder
	for i, e := range entries {
		if i > 0 {
			b.WriteByte('/')
		}
		b.WriteString(e.GetKey())
		b.WriteByte('=')
		b.WriteString(e.GetValue())
		if b.Len() > maxValueLabel {
			break
		}
	}
	v := b.String()
	if len(v) > maxValueLabel {
		v = v[:maxValueLabel]
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	vs := m.values[l]
	if vs == nil {
		vs = map[string]*ruleCounters{}
		m.values[l] = vs
	}
	if c := vs[v]; c != nil {
		return c
	}
	if len(vs) >= m.maxValues {
		v = otherValues
		if c := vs[v]; c != nil {
			return c
		}
	}
	c := m.counters(l, l.ID+"@"+v)
	vs[v] = c
	return c
}

// forRule returns the counters of a rule labelled by its ID alone, made at
// the rule's first check and kept in *cached.
func (m *ruleMetrics) forRule(l *policy.Limit, cached *atomic.Pointer[ruleCounters]) *ruleCounters {
	if c := cached.Load(); c != nil {
		return c
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if c := cached.Load(); c != nil {
		return c
	}
	c := m.counters(l, l.ID)
	cached.Store(c)
	return c
}

// prune drops the per-value counters of limits no longer in use (keep
// false), and deletes the series of rules that no limit in use has (live
// false for the rule's domain and ID), so that a changed policy does not
// keep its old labels' memory.
func (m *ruleMetrics) prune(keep func(*policy.Limit) bool, live func(domain, id string) bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for l := range m.values {
		if !keep(l) {
			delete(m.values, l)
		}
	}
	for lbl, rule := range m.made {
		if !live(rule.domain, rule.rule) {
			for _, v := range m.collectorVecs() {
				v.DeleteLabelValues(lbl.domain, lbl.rule)
			}
			delete(m.made, lbl)
		}
	}
}

// collectorVecs returns the five counter vectors.
func (m *ruleMetrics) collectorVecs() []*prometheus.CounterVec {
	return []*prometheus.CounterVec{m.totalHits, m.overLimit, m.nearLimit, m.withinLimit, m.shadowMode}
}

// record counts one check of cost hits against a limit of capacity, with
// its result, as envoyproxy/ratelimit does: every hit in total_hits; an
// admitted check's hits in within_limit, and those past the near-limit
// threshold (nearRatio of the capacity) also in near_limit; a refused
// check's hits in over_limit (sluice counts nothing for a refused request,
// so every hit of it was over), and in shadow_mode when the rule only
// shadows.
func (c *ruleCounters) record(nearRatio float64, capacity, cost int64, res *algorithms.Result, shadow bool) {
	if c == nil || cost <= 0 {
		return
	}
	hits := float64(cost)
	c.total.Add(hits)
	if !res.Allowed {
		c.over.Add(hits)
		if shadow {
			c.shadow.Add(hits)
		}
		return
	}
	c.within.Add(hits)
	if n := nearHits(nearRatio, capacity, cost, res.Remaining); n > 0 {
		c.near.Add(float64(n))
	}
}

// nearHits returns how many of an admitted check's cost hits fell past the
// near-limit threshold: the capacity's used part went from used-cost to
// used, used = capacity - remaining.
func nearHits(ratio float64, capacity, cost, remaining int64) int64 {
	threshold := int64(float64(capacity) * ratio)
	used := capacity - max(remaining, 0)
	if used <= threshold {
		return 0
	}
	return used - max(threshold, used-cost)
}
