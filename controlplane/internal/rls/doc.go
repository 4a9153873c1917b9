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
//
// # The metadata contract with the filter
//
// The field "sluice" of RateLimitResponse.dynamic_metadata (MetadataKey)
// reports, for the filter's local precheck, the parameters of the limit that
// decided each descriptor:
//
//	dynamic_metadata: {
//	  "sluice": [                 // a list, one struct per request descriptor, in order
//	    {
//	      "algorithm":      "token_bucket", // fixed_window | sliding_window | sliding_log |
//	                                        // token_bucket | gcra | reserve; "" = do not precheck
//	      "limit":          5,       // requests per window (the refill rate for
//	                                 // token_bucket, gcra and reserve)
//	      "window_ms":      1000,    // the window or refill period in milliseconds
//	                                 // (fractional when not whole milliseconds)
//	      "burst":          20,      // capacity: the most admitted at one instant
//	                                 // (the burst for token_bucket, gcra and reserve, else limit)
//	      "retry_after_ms": 0,       // when the descriptor's status is OVER_LIMIT: how
//	                                 // long until the same request would be allowed; else 0
//	      "failure_mode":   "closed", // the policy's failure_mode for this descriptor (open |
//	                                 // closed), which the filter applies when a later call
//	                                 // fails; absent when no policy matched the descriptor
//	      "name":           "api_key#0", // the limit's name in the RateLimit headers (LimitName);
//	                                 // absent when no policy matched the descriptor
//	      "wait_ms":        250      // reserve only, present when > 0: the descriptor is OK but
//	                                 // the request must wait this long before it proceeds (the
//	                                 // longest wait of the descriptor's reserve limits; the
//	                                 // slot is already taken)
//	    },
//	    ...
//	  ]
//	}
//
// All numbers are protobuf numbers (doubles); limit and burst are below
// 2^32; window_ms and retry_after_ms may be fractional (round retry_after_ms
// up). algorithm is "" (and limit, window_ms and burst 0) when the filter
// must not size a local bucket from the descriptor: nothing limits it, it is unlimited, its limits are in
// shadow_mode, the store failed and failure_mode decided, or a limit
// override of 0 requests answered. Several limits on one descriptor: the
// struct describes the one its status reports (the most restrictive), which
// is safe for a precheck since every limit must pass. retry_after_ms is set
// for every OVER_LIMIT status, including failure_mode closed (1000).
//
// wait_ms is the only way an answer says "wait": RLS has no field for it, and
// Envoy's own ratelimit filter, which does not read this metadata, passes a
// reserved request at once. A request waits for the longest wait_ms of its
// descriptors; it is only set when the overall code is OK or the descriptor
// itself is not over limit (a request refused by another descriptor still
// holds its slot, as every descriptor is counted on its own).
//
// # The settlement token budget (settlebudget.go)
//
// The store remembers a settlement's tokens (one store.Once per charge:
// a Redis key of about 133 bytes, a slot of the memory store's table) for
// the dedupe TTL, and any client of the decision port may send settlements
// with new tokens: one did write 1.82 million keys in 30 seconds. So each
// replica bounds the tokens it has asked the store to remember within a
// TTL (Options.SettleTokens), and shares that budget among its clients:
//
//   - a settlement whose new tokens would pass the budget is refused with
//     RESOURCE_EXHAUSTED, and nothing is charged; the filter sends it again
//     later, with the same token, so exactly-once still holds;
//   - past half the budget, a client gets new tokens only while it holds
//     fewer than its share: half the budget divided among the clients that
//     hold tokens. One client that floods holds at most half the budget
//     plus its share, and no client can take the rest from the others; and
//     nothing already remembered is dropped to make room (the memory
//     store's own table drops its oldest, which the budget keeps it from
//     reaching when it is the only store).
//
// A client is the peer's IP address (an IPv6 /64), so that an Envoy's
// connections count as one client. Duplicates (retries) give back what they
// took once the store has said so.
package rls
