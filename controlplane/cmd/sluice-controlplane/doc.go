// Command sluice-controlplane serves sluice's rate-limit decisions:
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit over gRPC, and
// /metrics, /healthz and /readyz over HTTP; with a token or a client CA the
// policy service (sluice.v1.PolicyService, for ratectl), and with -rlqs-addr
// Envoy's Rate Limit Quota Service.
//
//	sluice-controlplane -redis-addrs 127.0.0.1:6379 -policy policies/ -policy-watch 10s
//
// Every flag can also be set by its SLUICE_* environment variable (flags
// win); `sluice-controlplane -h` lists them by group, and
// docs/controlplane.md documents each with its default. The Redis password
// ($SLUICE_REDIS_PASSWORD) and the policy service's token ($SLUICE_TOKEN)
// are environment only, never flags. With Redis, policies live in Redis and
// every replica converges on them. Without a token or client CA the policy
// service is off (logged).
//
// Run under the name ratelimit (Envoy Gateway's /bin/ratelimit), it reads
// envoyproxy/ratelimit's environment instead of flags (package
// ratelimitenv; docs/envoy-gateway.md).
//
// Exit status: 0 after a clean shutdown, 1 when serving fails, 2 for bad
// flags or configuration.
package main
