// Package rls serves envoy.service.ratelimit.v3.RateLimitService: one
// ShouldRateLimit call decides a request's descriptors against the policies
// of its domain, with the semantics of envoyproxy/ratelimit so that Envoy's
// own ratelimit filter works against it unchanged:
//
//   - the domain selects a policy; an unknown domain or descriptor is OK;
//   - descriptors are answered in order, one status each: code,
//     current_limit {requests_per_unit, unit, unit_multiplier, name},
//     limit_remaining (0 when the descriptor's limit refused the request)
//     and duration_until_reset (whole seconds, rounded up, as Envoy reads
//     only the seconds);
//   - the overall code is OVER_LIMIT if any enforced limit is over;
//   - hits_addend is the cost (0 means 1); a descriptor's own hits_addend
//     overrides it (0 there peeks: nothing is counted);
//   - shadow_mode limits are evaluated and counted but answer OK;
//   - unlimited descriptors answer OK with limit_remaining 2^32-1;
//   - replaces drops the named limits across the whole request;
//   - a descriptor's limit override (requests_per_unit, unit,
//     unit_multiplier) replaces its configured limits with a fixed window,
//     as envoyproxy/ratelimit does, when the domain is known.
//
// sluice adds several limits per descriptor (all must pass; the status
// reports the most restrictive; each is counted on its own, so a request one
// limit denies still counts in the others, as envoyproxy/ratelimit counts
// each descriptor of a request; unlike envoyproxy/ratelimit, a limit that
// refuses a request counts none of its cost), the IETF RateLimit headers (see
// rateLimitHeaders) and per-descriptor limit parameters in dynamic_metadata
// for the filter's local precheck (see MetadataKey).
//
// When the store fails, each limit's failure_mode decides: open answers OK,
// closed answers OVER_LIMIT with duration_until_reset FailureRetryAfter.
//
// Policies are held behind an atomic pointer and replaced whole
// (SetPolicies), so a decision sees one version from start to end.
package rls
