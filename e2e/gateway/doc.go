// Package gateway proves sluice as Envoy Gateway's global rate limit
// service: an xDS server built as Envoy Gateway's (go-control-plane's
// SnapshotCache over mutual TLS) serves RateLimitConfig resources shaped as
// Envoy Gateway translates BackendTrafficPolicies, to sluice started as
// `ratelimit` with Envoy Gateway's environment, behind real Envoy running the
// listener, routes and cluster Envoy Gateway generates. The same scenarios
// run against envoyproxy/ratelimit at the version Envoy Gateway v1.9.0 pins
// (bench/ratelimit-peer), started with the same environment, and every
// difference must be a known one (knownDifferences).
package gateway
