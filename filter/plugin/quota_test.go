package plugin

import (
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// wallBase is the fake host's wall clock at its monotonic 0.
const wallBase = int64(1_800_000_000) * 1e9

// WallNow gives the fake host a wall clock that moves with its monotonic
// one.
func (h *fakeHost) WallNow() int64 { return wallBase + h.now }

const quotaConfig = `{
  "cluster": "sluice_cp", "domain": "edge", "timeout": "25ms",
  "rate_limits": [{"actions": [{"remote_address": {}}]}]
}`

// quotaAnswer is an OK answer whose one status carries a quota of n
// requests valid for valid from the fake host's now.
func quotaAnswer(t testing.TB, h *fakeHost, n uint32, valid time.Duration) *fakeAnswer {
	return grpcOK(t, &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{
			Code: rlsv3.RateLimitResponse_OK,
			Quota: &rlsv3.RateLimitResponse_Quota{Requests: n, ExpirationSpecifier: &rlsv3.RateLimitResponse_Quota_ValidUntil{
				ValidUntil: timestamppb.New(time.Unix(0, h.WallNow()+int64(valid)))}},
		}},
	})
}

// TestQuotaSpentLocally: a quota of n lets the answered request and n-1
// more through without a call, for the same descriptor only, until it is
// spent or expires; then requests call out again.
func TestQuotaSpentLocally(t *testing.T) {
	b := newTestbed(t, quotaConfig)
	req := map[string]string{":method": "GET", ":path": "/"}
	if _, a := b.request(req, "10.0.0.1:1"); a != ActionPause {
		t.Fatalf("first request: action %d", a)
	}
	b.deliver(quotaAnswer(t, b.host, 4, time.Second))
	calls := len(b.host.calls)
	for i := range 3 {
		if _, a := b.request(req, "10.0.0.1:1"); a != ActionContinue || len(b.host.calls) != calls {
			t.Fatalf("request %d on the quota: action %d, %d calls", i, a, len(b.host.calls))
		}
	}
	if b.host.counters[MetricQuotaAllowed] != 3 {
		t.Fatalf("counters %v", b.host.counters)
	}
	// Spent: the next one calls.
	if _, a := b.request(req, "10.0.0.1:1"); a != ActionPause || len(b.host.calls) != calls+1 {
		t.Fatalf("after the quota: action %d", a)
	}
	// Another descriptor has no quota.
	b.deliver(quotaAnswer(t, b.host, 10, 50*time.Millisecond))
	if _, a := b.request(req, "10.0.0.2:1"); a != ActionPause {
		t.Fatalf("another address used the quota: action %d", a)
	}
	b.deliver(quotaAnswer(t, b.host, 1, time.Second)) // no share: nothing kept
	// The quota of 10 expires after 50 ms.
	if _, a := b.request(req, "10.0.0.1:1"); a != ActionContinue {
		t.Fatalf("within validity: action %d", a)
	}
	b.host.now += int64(50 * time.Millisecond)
	calls = len(b.host.calls)
	if _, a := b.request(req, "10.0.0.1:1"); a != ActionPause || len(b.host.calls) != calls+1 {
		t.Fatalf("after validity: action %d", a)
	}
	// An answer whose quota has already expired keeps nothing.
	b.deliver(quotaAnswer(t, b.host, 10, -time.Millisecond))
	if _, a := b.request(req, "10.0.0.1:1"); a != ActionPause {
		t.Fatalf("an expired quota was spent: action %d", a)
	}
}

// TestQuotaNeedsEveryDescriptor: a request with two descriptors calls out
// unless both hold a quota; with hits_addend 2 no quota is spent.
func TestQuotaNeedsEveryDescriptor(t *testing.T) {
	b := newTestbed(t, testConfig) // remote_address, and api_key+path with hits_addend 2
	if _, a := b.request(apiRequest, "10.0.0.9:1"); a != ActionPause {
		t.Fatal("no call")
	}
	q := &rlsv3.RateLimitResponse_Quota{Requests: 5, ExpirationSpecifier: &rlsv3.RateLimitResponse_Quota_ValidUntil{
		ValidUntil: timestamppb.New(time.Unix(0, b.host.WallNow()+int64(time.Second)))}}
	b.deliver(grpcOK(t, &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
			{Code: rlsv3.RateLimitResponse_OK, Quota: q},
			{Code: rlsv3.RateLimitResponse_OK, Quota: q},
		},
	}))
	calls := len(b.host.calls)
	if _, a := b.request(apiRequest, "10.0.0.9:1"); a != ActionPause || len(b.host.calls) != calls+1 {
		t.Fatalf("a cost-2 descriptor was answered from a quota: action %d", a)
	}
	if b.host.counters[MetricQuotaAllowed] != 0 {
		t.Fatalf("counters %v", b.host.counters)
	}
}
