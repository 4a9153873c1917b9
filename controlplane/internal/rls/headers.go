package rls

import (
	"math"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/policy"
)

// Header names of draft-ietf-httpapi-ratelimit-headers-10 and RFC 9110.
const (
	HeaderPolicy     = "RateLimit-Policy"
	HeaderRateLimit  = "RateLimit"
	HeaderRetryAfter = "Retry-After"
)

// currentLimit returns a limit as RLS reports it: requests_per_unit per unit
// (times unit_multiplier when the window is several units).
func currentLimit(l *policy.Limit) *rlsv3.RateLimitResponse_RateLimit {
	rl := &rlsv3.RateLimitResponse_RateLimit{Name: l.Name, RequestsPerUnit: uint32(min(l.Requests, math.MaxUint32))}
	u, mult := reportUnit(l)
	rl.Unit = rlsv3.RateLimitResponse_RateLimit_Unit(u)
	if mult > 1 {
		rl.UnitMultiplier = wrapperspb.UInt32(mult)
	}
	return rl
}

// reportUnit returns the unit and multiplier describing l's window: the
// configured unit, else the largest of day, hour, minute and second that
// divides the window (30s is 30 SECOND, 90m is 90 MINUTE), else UNKNOWN.
func reportUnit(l *policy.Limit) (algorithms.Unit, uint32) {
	if l.Unit != algorithms.UnitUnknown {
		return l.Unit, 1
	}
	for _, u := range []algorithms.Unit{algorithms.UnitDay, algorithms.UnitHour, algorithms.UnitMinute, algorithms.UnitSecond} {
		d := time.Duration(u.Seconds()) * time.Second
		if l.Window > 0 && l.Window%d == 0 && l.Window/d <= math.MaxUint32 {
			return u, uint32(l.Window / d)
		}
	}
	return algorithms.UnitUnknown, 0
}

// rateLimitHeaders returns the IETF RateLimit headers
// (draft-ietf-httpapi-ratelimit-headers-10) for one response, for a domain
// whose policy sets response_headers:
//
//	RateLimit-Policy: "per_address";q=10;w=10, "api_key=a#0";q=5;w=1
//	RateLimit: "per_address";r=3;t=7, "api_key=a#0";r=0;t=1
//	Retry-After: 1                      (only when the request is over limit)
//
// There is one item per descriptor that an enforced limit decided, in
// descriptor order (a name seen twice is listed once). The policy name is
// the limit's name, else its ID; q is requests per window and w the window
// in seconds (left out for windows that are not whole seconds, and for
// calendar windows, whose lengths differ); r is what remains of the
// capacity (for token_bucket and gcra the burst, so r can exceed q), 0
// when the limit refused the request, and t the seconds until
// the limiter is full again, or, when the request is over limit, until the
// same request would be allowed (see outcome.remaining and reset). Shadow
// limits and limits decided by failure_mode are not advertised. Retry-After
// is the longest wait among the over-limit descriptors, in whole seconds
// rounded up.
func rateLimitHeaders(outs []outcome, over bool) []*corev3.HeaderValue {
	var pol, cur strings.Builder
	var retry int64
	var seen []string
	for i := range outs {
		o := &outs[i]
		if o.lim == nil {
			continue
		}
		if o.over() && o.res.RetryAfter > retry {
			retry = o.res.RetryAfter
		}
		if o.lim.ShadowMode || o.failed {
			continue
		}
		name := LimitName(o.lim)
		if contains(seen, name) {
			continue
		}
		seen = append(seen, name)
		if pol.Len() > 0 {
			pol.WriteString(", ")
			cur.WriteString(", ")
		}
		appendSFString(&pol, name)
		pol.WriteString(";q=")
		pol.WriteString(strconv.FormatInt(o.lim.Requests, 10))
		if w := o.lim.Window; w >= time.Second && w%time.Second == 0 && o.info.store.Calendar == nil { // a calendar window has no one length
			pol.WriteString(";w=")
			pol.WriteString(strconv.FormatInt(int64(w/time.Second), 10))
		}
		appendSFString(&cur, name)
		cur.WriteString(";r=")
		cur.WriteString(strconv.FormatInt(o.remaining(), 10))
		cur.WriteString(";t=")
		cur.WriteString(strconv.FormatInt(ceilSeconds(o.reset()), 10))
	}
	var hs []*corev3.HeaderValue
	if pol.Len() > 0 {
		hs = append(hs,
			&corev3.HeaderValue{Key: HeaderPolicy, Value: pol.String()},
			&corev3.HeaderValue{Key: HeaderRateLimit, Value: cur.String()})
	}
	if over && retry > 0 {
		hs = append(hs, &corev3.HeaderValue{Key: HeaderRetryAfter, Value: strconv.FormatInt(ceilSeconds(retry), 10)})
	}
	return hs
}

// LimitName is the name of l in the RateLimit headers: its name, else its
// ID ("api_key#0"). The filter names limits the same way: the control plane
// tells it the name in the sluice metadata (MetaName).
func LimitName(l *policy.Limit) string {
	if l.Name != "" {
		return l.Name
	}
	return l.ID
}

// appendSFString writes s as a Structured Field String (RFC 8941 3.3.3):
// quoted, with '"' and '\' escaped. Bytes a String cannot hold (controls,
// non-ASCII) and '%' are written as %XX, so distinct names stay distinct.
func appendSFString(b *strings.Builder, s string) {
	const hex = "0123456789ABCDEF"
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c > 0x7e || c == '%':
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
}

// ceilSeconds returns ns nanoseconds in whole seconds, rounded up.
func ceilSeconds(ns int64) int64 {
	if ns <= 0 {
		return 0
	}
	return (ns-1)/int64(time.Second) + 1
}

// contains reports whether list holds s.
func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
