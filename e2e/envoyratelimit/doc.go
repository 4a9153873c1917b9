// Package envoyratelimit tests Envoy's own rate limit filter
// (envoy.filters.http.ratelimit, no Wasm) against sluice-controlplane: the
// way most envoyproxy/ratelimit users switch. Every test
// runs real Envoy ($ENVOY_BIN or .venv/bin/envoy), the sluice-controlplane
// binary built from this tree and, for the Redis runs, a real redis-server,
// all on 127.0.0.1.
//
// Each scenario runs on every setup: Envoy's two gRPC clients (envoy_grpc
// and google_grpc) against the default unary decision server, and
// envoy_grpc against -grpc-server grpc-go, each on the memory store and on
// Redis.
package envoyratelimit
