package rls

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// unknownDomain is the domain label of requests for domains no policy
// defines, so that hostile domain names cannot grow the label set.
const unknownDomain = "unknown"

// Metrics are the service's Prometheus collectors. Every domain label is a
// configured domain or "unknown".
type Metrics struct {
	// Decisions counts answered requests by domain and overall code
	// (OK, OVER_LIMIT).
	Decisions *prometheus.CounterVec
	// OverLimit counts enforced limits found over limit, by domain.
	OverLimit *prometheus.CounterVec
	// ShadowOverLimit counts shadow_mode limits that were over limit (and
	// answered OK), by domain.
	ShadowOverLimit *prometheus.CounterVec
	// StoreErrors counts requests whose store call failed, by domain.
	StoreErrors *prometheus.CounterVec
	// FailureMode counts limits decided by their failure_mode because the
	// store failed, by domain and mode (open, closed).
	FailureMode *prometheus.CounterVec
	// Invalid counts requests refused with InvalidArgument, by reason.
	Invalid *prometheus.CounterVec
	// Latency is the time to answer a request, in seconds.
	Latency prometheus.Histogram
	// Settlements counts settled descriptors (x-sluice-settle) by result:
	// applied (charged) or duplicate (a retry: nothing charged).
	Settlements *prometheus.CounterVec
	// SettleRefused counts settlements refused for the token budget, by
	// reason: full (the replica's budget) or share (the client's share).
	SettleRefused *prometheus.CounterVec

	children sync.Map // domain label -> *domainMetrics
}

// domainMetrics are one domain's counters, resolved once.
type domainMetrics struct {
	ok, overLimit, overLimitCode, shadow, storeErrors, failOpen, failClosed prometheus.Counter
}

// Reasons for refusing a request (the Invalid label).
const (
	reasonEmptyDomain    = "empty_domain"
	reasonNoDescriptors  = "no_descriptors"
	reasonTooMany        = "too_many_descriptors"
	reasonBadOverride    = "bad_limit_override"
	reasonNilDescriptor  = "nil_descriptor"
	reasonTooManyEntries = "too_many_entries"
)

// NewMetrics returns the collectors, registered with reg unless reg is nil.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_rls_decisions_total",
			Help: "ShouldRateLimit requests answered, by domain and overall code.",
		}, []string{"domain", "code"}),
		OverLimit: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_rls_over_limit_total",
			Help: "Enforced limits found over limit, by domain.",
		}, []string{"domain"}),
		ShadowOverLimit: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_rls_shadow_over_limit_total",
			Help: "shadow_mode limits found over limit and answered OK, by domain.",
		}, []string{"domain"}),
		StoreErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_rls_store_errors_total",
			Help: "Requests whose store call failed (each limit then follows its failure_mode), by domain.",
		}, []string{"domain"}),
		FailureMode: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_rls_failure_mode_total",
			Help: "Limits decided by their failure_mode because the store failed, by domain and mode.",
		}, []string{"domain", "mode"}),
		Invalid: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_rls_invalid_requests_total",
			Help: "ShouldRateLimit requests refused with InvalidArgument, by reason.",
		}, []string{"reason"}),
		Latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sluice_rls_request_duration_seconds",
			Help:    "Time to answer a ShouldRateLimit request.",
			Buckets: prometheus.ExponentialBuckets(25e-6, 2, 17), // 25 µs .. 1.6 s
		}),
		Settlements: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_settlements_total",
			Help: "Descriptors of settlements (x-sluice-settle) by result: applied (charged) or duplicate (already applied: nothing charged).",
		}, []string{"result"}),
		SettleRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_settle_tokens_refused_total",
			Help: "Settlements refused with RESOURCE_EXHAUSTED for the settlement token budget, by reason: full (the replica's -settle-max-tokens) or share (the client's share of it).",
		}, []string{"reason"}),
	}
	m.Settlements.WithLabelValues(settleApplied)
	m.Settlements.WithLabelValues(settleDuplicate)
	m.SettleRefused.WithLabelValues(refusedFull)
	m.SettleRefused.WithLabelValues(refusedShare)
	for _, r := range []string{reasonEmptyDomain, reasonNoDescriptors, reasonTooMany, reasonBadOverride,
		reasonNilDescriptor, reasonTooManyEntries, reasonBadSettleToken, reasonTooManySettled} {
		m.Invalid.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.Decisions, m.OverLimit, m.ShadowOverLimit, m.StoreErrors, m.FailureMode, m.Invalid, m.Latency, m.Settlements, m.SettleRefused)
	}
	return m
}

// domain returns the counters of one domain label.
func (m *Metrics) domain(label string) *domainMetrics {
	if d, ok := m.children.Load(label); ok {
		return d.(*domainMetrics)
	}
	d := &domainMetrics{
		ok:          m.Decisions.WithLabelValues(label, "OK"),
		overLimit:   m.OverLimit.WithLabelValues(label),
		shadow:      m.ShadowOverLimit.WithLabelValues(label),
		storeErrors: m.StoreErrors.WithLabelValues(label),
		failOpen:    m.FailureMode.WithLabelValues(label, "open"),
		failClosed:  m.FailureMode.WithLabelValues(label, "closed"),
	}
	d.overLimitCode = m.Decisions.WithLabelValues(label, "OVER_LIMIT")
	v, _ := m.children.LoadOrStore(label, d)
	return v.(*domainMetrics)
}
