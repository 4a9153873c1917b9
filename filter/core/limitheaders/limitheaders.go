// Package limitheaders formats the rate limit response headers: the IETF
// draft's RateLimit-Policy and RateLimit fields
// (draft-ietf-httpapi-ratelimit-headers-10), the older X-RateLimit-* fields,
// and Retry-After. All functions append to a caller's buffer and allocate
// nothing.
//
//	RateLimit-Policy: "per-ip";q=100;w=60, "per-key";q=5000;w=3600
//	RateLimit: "per-ip";r=0;t=30, "per-key";r=4200;t=1800
//	X-RateLimit-Limit: 100
//	X-RateLimit-Remaining: 0
//	X-RateLimit-Reset: 30
//	Retry-After: 30
package limitheaders

import (
	"strconv"
	"strings"
)

// Header names.
const (
	PolicyHeader     = "ratelimit-policy"
	RateLimitHeader  = "ratelimit"
	LegacyLimit      = "x-ratelimit-limit"
	LegacyRemaining  = "x-ratelimit-remaining"
	LegacyReset      = "x-ratelimit-reset"
	RetryAfterHeader = "retry-after"
)

// names lists the header names above.
var names = [...]string{PolicyHeader, RateLimitHeader, LegacyLimit, LegacyRemaining, LegacyReset, RetryAfterHeader}

// IsLimitHeader reports whether name, in any case, is one of the headers
// this package formats. The filter formats these itself, as its plugin
// configuration says, and drops the control plane's copies of them
// (response_headers_to_add), so that one answer carries one set.
func IsLimitHeader(name string) bool {
	for _, n := range names {
		if len(name) == len(n) && strings.EqualFold(name, n) {
			return true
		}
	}
	return false
}

// Policy is one quota policy and its current state.
type Policy struct {
	Name      string // the policy's name, an sf-string once quoted
	Quota     int64  // quota units per window (q)
	Window    int64  // window in nanoseconds (w, written in whole seconds)
	Remaining int64  // quota units left (r)
	Reset     int64  // nanoseconds until the quota resets (t, whole seconds)
}

// Seconds converts nanoseconds to whole seconds, rounding up; negative
// durations are 0.
func Seconds(ns int64) int64 {
	if ns <= 0 {
		return 0
	}
	return (ns-1)/1e9 + 1
}

// AppendName appends name as a structured-field string (RFC 8941): quoted,
// with '"' and '\' escaped. Bytes an sf-string cannot hold (controls,
// non-ASCII) become '_'.
func AppendName(dst []byte, name string) []byte {
	dst = append(dst, '"')
	if plain(name) { // the usual name: copied at once, not byte by byte
		dst = append(dst, name...)
		return append(dst, '"')
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c < 0x20 || c > 0x7e:
			dst = append(dst, '_')
		default:
			dst = append(dst, c)
		}
	}
	return append(dst, '"')
}

// plain reports whether name is an sf-string's content as it is: no byte
// to escape or replace.
func plain(name string) bool {
	for i := 0; i < len(name); i++ {
		if c := name[i]; c == '"' || c == '\\' || c < 0x20 || c > 0x7e {
			return false
		}
	}
	return true
}

// AppendPolicy appends a RateLimit-Policy field value listing ps.
func AppendPolicy(dst []byte, ps []Policy) []byte {
	for i := range ps {
		if i > 0 {
			dst = append(dst, ", "...)
		}
		dst = AppendName(dst, ps[i].Name)
		dst = append(dst, ";q="...)
		dst = strconv.AppendInt(dst, max(ps[i].Quota, 0), 10)
		dst = append(dst, ";w="...)
		dst = strconv.AppendInt(dst, max(Seconds(ps[i].Window), 1), 10)
	}
	return dst
}

// AppendRateLimit appends a RateLimit field value with the state of ps.
func AppendRateLimit(dst []byte, ps []Policy) []byte {
	for i := range ps {
		if i > 0 {
			dst = append(dst, ", "...)
		}
		dst = AppendName(dst, ps[i].Name)
		dst = append(dst, ";r="...)
		dst = strconv.AppendInt(dst, max(ps[i].Remaining, 0), 10)
		dst = append(dst, ";t="...)
		dst = strconv.AppendInt(dst, Seconds(ps[i].Reset), 10)
	}
	return dst
}

// MostRestrictive returns the index of the policy with the least remaining
// (the longest reset among equals), which the single-valued X-RateLimit-*
// fields describe; -1 when ps is empty.
func MostRestrictive(ps []Policy) int {
	best := -1
	for i := range ps {
		if best < 0 || ps[i].Remaining < ps[best].Remaining ||
			(ps[i].Remaining == ps[best].Remaining && ps[i].Reset > ps[best].Reset) {
			best = i
		}
	}
	return best
}

// AppendInt appends n in decimal, negative values as 0: the value of
// X-RateLimit-Limit and X-RateLimit-Remaining.
func AppendInt(dst []byte, n int64) []byte {
	return strconv.AppendInt(dst, max(n, 0), 10)
}

// AppendSeconds appends a duration in whole seconds, rounded up: the value
// of X-RateLimit-Reset.
func AppendSeconds(dst []byte, ns int64) []byte {
	return strconv.AppendInt(dst, Seconds(ns), 10)
}

// AppendRetryAfter appends a Retry-After value (delta-seconds, rounded up,
// at least 1).
func AppendRetryAfter(dst []byte, ns int64) []byte {
	return strconv.AppendInt(dst, max(Seconds(ns), 1), 10)
}
