package core

import (
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// quotaConfig has prefetch off: its tests pin how requests renew a pool
// themselves (prefetchConfig, renew_test.go, has it on).
const quotaConfig = `{
  "cluster": "sluice_cp", "domain": "edge", "timeout": "25ms", "lease_prefetch": false,
  "rate_limits": [{"actions": [{"remote_address": {}}]}]
}`

// prefetchConfig is quotaConfig with prefetch on (the default).
const prefetchConfig = `{
  "cluster": "sluice_cp", "domain": "edge", "timeout": "25ms",
  "rate_limits": [{"actions": [{"remote_address": {}}]}]
}`

// quotaAnswer is an OK answer whose one status carries a quota of n
// requests valid for valid from the fake host's now.
func quotaAnswer(t testing.TB, h *fakeHost, n uint32, valid time.Duration) *fakeAnswer {
	return renewalAnswer(t, h, n, valid, "")
}

// renewalAnswer is quotaAnswer for a limit of algorithm alg, as the
// control plane's metadata says; "" sends no metadata.
func renewalAnswer(t testing.TB, h *fakeHost, n uint32, valid time.Duration, alg string) *fakeAnswer {
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{
			Code: rlsv3.RateLimitResponse_OK,
			Quota: &rlsv3.RateLimitResponse_Quota{Requests: n, ExpirationSpecifier: &rlsv3.RateLimitResponse_Quota_ValidUntil{
				ValidUntil: timestamppb.New(time.Unix(0, h.WallNow()+int64(valid)))}},
		}},
	}
	if alg != "" {
		resp.DynamicMetadata = metadata(t, map[string]any{"algorithm": alg, "limit": 100, "window_ms": 1000, "burst": 100})
	}
	return grpcOK(t, resp)
}

// TestQuotaSpentLocally: a quota of n lets the answered request and n-1
// more through without a call, for the same descriptor only, until it is
// spent or expires; then requests call out again.
func TestQuotaSpentLocally(t *testing.T) {
	b := newTestbed(t, quotaConfig)
	req := map[string]string{":method": "GET", ":path": "/"}
	if _, a := b.request(req, "10.0.0.1:1"); a != Pause {
		t.Fatalf("first request: action %d", a)
	}
	b.deliver(quotaAnswer(t, b.host, 4, time.Second))
	calls := len(b.host.calls)
	for i := range 3 {
		if _, a := b.request(req, "10.0.0.1:1"); a != Continue || len(b.host.calls) != calls {
			t.Fatalf("request %d on the quota: action %d, %d calls", i, a, len(b.host.calls))
		}
	}
	if b.host.counters[MetricQuotaAllowed] != 3 {
		t.Fatalf("counters %v", b.host.counters)
	}
	// Spent: the next one calls.
	if _, a := b.request(req, "10.0.0.1:1"); a != Pause || len(b.host.calls) != calls+1 {
		t.Fatalf("after the quota: action %d", a)
	}
	// Another descriptor has no quota.
	b.deliver(quotaAnswer(t, b.host, 10, 50*time.Millisecond))
	if _, a := b.request(req, "10.0.0.2:1"); a != Pause {
		t.Fatalf("another address used the quota: action %d", a)
	}
	b.deliver(quotaAnswer(t, b.host, 1, time.Second)) // no share: nothing kept
	// The quota of 10 expires after 50 ms.
	if _, a := b.request(req, "10.0.0.1:1"); a != Continue {
		t.Fatalf("within validity: action %d", a)
	}
	b.host.now += int64(50 * time.Millisecond)
	calls = len(b.host.calls)
	if _, a := b.request(req, "10.0.0.1:1"); a != Pause || len(b.host.calls) != calls+1 {
		t.Fatalf("after validity: action %d", a)
	}
	// An answer whose quota has already expired keeps nothing.
	b.deliver(quotaAnswer(t, b.host, 10, -time.Millisecond))
	if _, a := b.request(req, "10.0.0.1:1"); a != Pause {
		t.Fatalf("an expired quota was spent: action %d", a)
	}
}

// TestQuotaNeedsEveryDescriptor: a request with two descriptors calls out
// unless both hold a quota; with hits_addend 2 no quota is spent.
func TestQuotaNeedsEveryDescriptor(t *testing.T) {
	b := newTestbed(t, testConfig) // remote_address, and api_key+path with hits_addend 2
	if _, a := b.request(apiRequest, "10.0.0.9:1"); a != Pause {
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
	if _, a := b.request(apiRequest, "10.0.0.9:1"); a != Pause || len(b.host.calls) != calls+1 {
		t.Fatalf("a cost-2 descriptor was answered from a quota: action %d", a)
	}
	if b.host.counters[MetricQuotaAllowed] != 0 {
		t.Fatalf("counters %v", b.host.counters)
	}
}

// deliverCall delivers an answer to call i.
func (b *testbed) deliverCall(i int, a *fakeAnswer) {
	b.answerCall(b.host.calls[i].id, a)
}

// TestQuotasAddUp: two calls under way at once each bring a share; both
// are kept (until the earlier end), and a held quota overrides the
// precheck's rejection (the control plane granted those requests).
func TestQuotasAddUp(t *testing.T) {
	b := newTestbed(t, quotaConfig)
	req := map[string]string{":method": "GET", ":path": "/"}
	b.request(req, "10.0.0.1:1")
	b.request(req, "10.0.0.1:1")
	if len(b.host.calls) != 2 {
		t.Fatalf("%d calls", len(b.host.calls))
	}
	b.deliverCall(0, quotaAnswer(t, b.host, 3, time.Second))
	b.deliverCall(1, quotaAnswer(t, b.host, 4, 100*time.Millisecond))
	calls := len(b.host.calls)
	for i := range 5 {
		if _, a := b.request(req, "10.0.0.1:1"); a != Continue || len(b.host.calls) != calls {
			t.Fatalf("request %d: action %d: the two shares (2 + 3) do not add up", i, a)
		}
	}
	if _, a := b.request(req, "10.0.0.1:1"); a != Pause {
		t.Fatal("a sixth request was admitted")
	}
	// The sixth request's call is under way: two more requests of the
	// descriptor wait for it (wait.go) instead of calling. It is answered
	// OVER_LIMIT, which makes the precheck reject the descriptor; the
	// waiters find no quota and call. A quota granted by a call under way
	// still admits (the control plane granted those requests).
	n := len(b.host.calls)
	_, a1 := b.request(req, "10.0.0.1:1")
	_, a2 := b.request(req, "10.0.0.1:1")
	if a1 != Pause || a2 != Pause || len(b.host.calls) != n || b.host.counters[MetricLeaseWaited] != 2 {
		t.Fatalf("two requests during a call: actions %d %d, %d new calls, %d waited", a1, a2, len(b.host.calls)-n, b.host.counters[MetricLeaseWaited])
	}
	b.deliverCall(n-1, grpcOK(t, &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OVER_LIMIT,
			DurationUntilReset: durationpb.New(30 * time.Second)}},
		DynamicMetadata: metadata(t, map[string]any{"algorithm": "fixed_window", "limit": 10, "window_ms": 60000, "retry_after_ms": 30000}),
	}))
	if len(b.host.calls) != n+2 {
		t.Fatalf("after the answer without a quota %d waiters called, want 2", len(b.host.calls)-n)
	}
	if id, a := b.request(req, "10.0.0.1:1"); a != Pause || b.host.local[id].details != DetailsPrecheck {
		t.Fatalf("after OVER_LIMIT the precheck did not reject: action %d", a)
	}
	b.deliverCall(n, quotaAnswer(t, b.host, 3, time.Second))
	for i := range 2 {
		if id, a := b.request(req, "10.0.0.1:1"); a != Continue || b.host.local[id].status != 0 {
			t.Fatalf("request %d on a quota after OVER_LIMIT: action %d", i, a)
		}
	}
	if id, a := b.request(req, "10.0.0.1:1"); a != Pause || b.host.local[id].details != DetailsPrecheck {
		t.Fatalf("quota spent: the precheck rejects again: action %d", a)
	}
}
