package core

import (
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// TestAdmittedAnswersChargeThePrecheck: the filter reads no clock for an
// admitted answer, so the precheck charges its local bucket at the next
// request's time (precheck.Table.RecordAdmitted). The bucket of a limit
// of 1 an hour holds 4 (2N and the slack of a 25 ms timeout): after 4
// admitted calls the 5th request is rejected without a call, as when the
// answers were charged at their arrival; unless the 5th comes more than
// the timeout after the 4th call was sent, when that charge is dropped
// (it could no longer be made within the timeout of the decision) and
// the request calls out.
func TestAdmittedAnswersChargeThePrecheck(t *testing.T) {
	const config = `{"cluster": "rls", "domain": "d", "timeout": "25ms",
		"rate_limits": [{"actions": [{"request_headers": {"header_name": "x-user", "descriptor_key": "user"}}]}],
		"precheck": {"enabled": true}}`
	for _, tt := range []struct {
		name  string
		after time.Duration // between the 4th call and the 5th request
		calls int           // calls made for the 5 requests
	}{
		{"within the timeout", 25 * time.Millisecond, 4},
		{"past the timeout", 26 * time.Millisecond, 5},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := newTestbed(t, config)
			req := map[string]string{":method": "GET", ":path": "/", "x-user": "u"}
			ok := grpcOK(t, &rlsv3.RateLimitResponse{
				OverallCode: rlsv3.RateLimitResponse_OK,
				Statuses:    []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OK}},
				DynamicMetadata: metadata(t,
					map[string]any{"algorithm": "fixed_window", "limit": 1, "window_ms": 3600e3}),
			})
			for i := range 4 {
				if _, action := b.request(req, ""); action != Pause || len(b.host.calls) != i+1 {
					t.Fatalf("request %d: action %d, %d calls", i+1, action, len(b.host.calls))
				}
				b.deliver(ok)
			}
			b.host.now += int64(tt.after)
			id, _ := b.request(req, "")
			if len(b.host.calls) != tt.calls {
				t.Fatalf("%d calls for 5 requests, want %d", len(b.host.calls), tt.calls)
			}
			if l, rejected := b.host.local[id]; rejected != (tt.calls == 4) || (rejected && l.details != DetailsPrecheck) {
				t.Fatalf("5th request: local reply %v %+v", rejected, l)
			}
		})
	}
}
