package rls

import (
	"time"

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

// setDuration sets p to d, as durationpb.New(d) would.
func setDuration(p *durationpb.Duration, d time.Duration) {
	secs := d / time.Second
	p.Seconds = int64(secs)
	p.Nanos = int32(d - secs*time.Second)
}
