package rls

import (
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
)

// oneResponse is the response of a one-descriptor request in a single
// allocation.
type oneResponse struct {
	resp rlsv3.RateLimitResponse
	sts  [1]*rlsv3.RateLimitResponse_DescriptorStatus
	st   rlsv3.RateLimitResponse_DescriptorStatus
	dur  durationpb.Duration
}

// newResponse returns an OK response with n statuses, each with a
// duration_until_reset, in a few allocations.
func newResponse(n int) *rlsv3.RateLimitResponse {
	if n == 1 {
		o := &oneResponse{}
		o.st.DurationUntilReset = &o.dur
		o.sts[0] = &o.st
		o.resp.Statuses = o.sts[:]
		o.resp.OverallCode = rlsv3.RateLimitResponse_OK
		return &o.resp
	}
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, n),
	}
	sts := make([]rlsv3.RateLimitResponse_DescriptorStatus, n)
	durs := make([]durationpb.Duration, n)
	for i := range sts {
		sts[i].DurationUntilReset = &durs[i]
		resp.Statuses[i] = &sts[i]
	}
	return resp
}

// setSeconds sets p to ns nanoseconds rounded up to whole seconds.
// duration_until_reset carries whole seconds, as envoyproxy/ratelimit sends
// it: Envoy's ratelimit filter builds X-RateLimit-Reset from the seconds
// field alone, so a fraction would make it read a second low (0 for
// per-second limits). Rounding up never promises a reset earlier than the
// real one. The exact figures stay where sluice's own consumers read them:
// the RateLimit headers (rateLimitHeaders) and the filter's metadata
// (retry_after_ms, see MetadataKey) are computed from the store's result.
func setSeconds(p *durationpb.Duration, ns int64) {
	p.Seconds = ceilSeconds(ns)
	p.Nanos = 0
}
