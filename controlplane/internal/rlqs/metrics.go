package rlqs

import "github.com/prometheus/client_golang/prometheus"

// metrics are the service's Prometheus metrics.
type metrics struct {
	reports      prometheus.Counter
	badReports   prometheus.Counter
	refused      prometheus.Counter
	shed         prometheus.Counter
	loans        prometheus.Counter
	storeErrors  prometheus.Counter
	demandErrors prometheus.Counter
	actions      *prometheus.CounterVec
}

// newMetrics makes the metrics and registers them on r (nil: none).
func newMetrics(r prometheus.Registerer, streams func() int) metrics {
	m := metrics{
		reports:      prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_rlqs_reports_total", Help: "RLQS usage reports answered."}),
		badReports:   prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_rlqs_bad_reports_total", Help: "RLQS usage reports refused as malformed (the stream ends with InvalidArgument)."}),
		refused:      prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_rlqs_buckets_refused_total", Help: "Bucket reports left without assignment: the stream already had its maximum of buckets, or its connection its share of the bucket budget."}),
		shed:         prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_rlqs_buckets_shed_total", Help: "Buckets dropped from a connection over its share of the bucket budget, to make room for a connection under its share."}),
		loans:        prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_rlqs_loans_total", Help: "Assignments lent from the usage budget to an Envoy that the others' assignments in force left without a share (a newcomer)."}),
		storeErrors:  prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_rlqs_store_errors_total", Help: "Usage debits the store could not make."}),
		demandErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_rlqs_demand_errors_total", Help: "Reports whose shares were sized from this replica's Envoys only: the shared demand (Redis) did not answer."}),
		actions:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_rlqs_actions_total", Help: "RLQS bucket actions sent, by kind (token_bucket, allow_all, deny_all, abandon)."}, []string{"action"}),
	}
	if r != nil {
		r.MustRegister(m.reports, m.badReports, m.refused, m.shed, m.loans, m.storeErrors, m.demandErrors, m.actions,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_rlqs_streams", Help: "Open RLQS streams."},
				func() float64 { return float64(streams()) }))
	}
	return m
}
