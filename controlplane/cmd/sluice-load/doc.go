// Command sluice-load measures a rate-limit service: N callers call
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit back to back
// for a fixed time, each request one descriptor {key: value} with the value
// spread over K distinct keys, and it prints decisions per second, latency
// percentiles, and the OK / OVER_LIMIT / error counts. It works against any
// RLS v3 server (sluice, envoyproxy/ratelimit).
//
//	sluice-load -addr 127.0.0.1:8081 -callers 64 -keys 1000 -duration 10s \
//	    -domain sluice-demo -key remote_address
//
// It is bounded: loopback addresses only, at most 4096 callers, at most 10
// minutes, and optionally at most -requests calls in all.
//
// The tool shares the machine with what it measures, so it is lean: by
// default it calls through leanConn (a minimal gRPC client over HTTP/2, no
// allocation per call) and reads only a response's overall_code;
// -client grpc uses grpc-go instead. It runs with GOGC=400 unless GOGC is
// set.
package main
