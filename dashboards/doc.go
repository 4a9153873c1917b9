// Package dashboards holds sluice's Grafana dashboard (grafana-sluice.json)
// and the test that keeps it honest: every metric its queries name must be
// one that a running sluice-controlplane or Envoy with filter.wasm exports.
//
// Import the JSON in Grafana (Dashboards, New, Import) and pick the
// Prometheus data source that scrapes the control plane's /metrics and
// Envoy's admin /stats/prometheus.
package dashboards
