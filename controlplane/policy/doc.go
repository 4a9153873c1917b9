// Package policy reads, validates, matches and writes sluice's rate-limit
// policies.
//
// The format is envoyproxy/ratelimit's YAML, read as-is:
//
//	domain: api
//	descriptors:
//	  - key: remote_address
//	    rate_limit:
//	      unit: second
//	      requests_per_unit: 10
//
// with nested descriptors, optional values, wildcard values ending in "*",
// rate_limit name/replaces/unlimited, shadow_mode and detailed_metric. sluice
// extends it with a per-limit algorithm, windows of any length (window: 30s),
// burst, several limits on one descriptor (rate_limits:), failure_mode and a
// domain-level response_headers switch. Unknown fields are errors, and every
// error names the file, line, domain and field.
//
// A parsed Domain is immutable and safe for concurrent use; Match allocates
// nothing.
package policy
