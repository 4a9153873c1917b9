package core

import (
	"errors"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// spentPool gives b a lease pool for 10.0.0.1's descriptor and spends it:
// the next request finds the pool empty.
func spentPool(t *testing.T, b *testbed) {
	t.Helper()
	req := map[string]string{":method": "GET", ":path": "/"}
	b.request(req, "10.0.0.1:1")
	b.deliver(quotaAnswer(t, b.host, 2, time.Second))
	if _, a := b.request(req, "10.0.0.1:1"); a != Continue {
		t.Fatalf("the quota's unit: action %d", a)
	}
}

// okNoQuota is an allowed answer without a quota.
func okNoQuota(t *testing.T) *fakeAnswer {
	return grpcOK(t, &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OK}}})
}

// TestWaitForCall: the pool is spent; the first request calls, the next
// two wait for that call instead of calling, and its quota admits them.
func TestWaitForCall(t *testing.T) {
	b := newTestbed(t, quotaConfig)
	req := map[string]string{":method": "GET", ":path": "/"}
	first, w1, w2, calls := callAndWaiters(t, b)
	quota := b.host.counters[MetricQuotaAllowed]
	b.deliver(quotaAnswer(t, b.host, 5, time.Second))
	h := b.host
	if h.resumed[first] != 1 || h.resumed[w1] != 1 || h.resumed[w2] != 1 || len(h.calls) != calls+1 || h.counters[MetricQuotaAllowed] != quota+2 {
		t.Fatalf("resumed %d %d %d, %d calls, %d from quotas", h.resumed[first], h.resumed[w1], h.resumed[w2], len(h.calls)-calls, h.counters[MetricQuotaAllowed]-quota)
	}
	// 5 - the caller's - the two waiters' = 2 left
	for i := range 3 {
		if _, a := b.request(req, "10.0.0.1:1"); (a == Continue) != (i < 2) {
			t.Fatalf("request %d after the waiters: action %d", i, a)
		}
	}
}

// callAndWaiters spends b's pool, then sends three requests: the first
// calls, the next two wait for its call. It returns the three and the
// number of calls made before them.
func callAndWaiters(t *testing.T, b *testbed) (first, w1, w2 uint32, calls int) {
	t.Helper()
	spentPool(t, b)
	req := map[string]string{":method": "GET", ":path": "/"}
	calls = len(b.host.calls)
	first, _ = b.request(req, "10.0.0.1:1")
	w1, a1 := b.request(req, "10.0.0.1:1")
	w2, a2 := b.request(req, "10.0.0.1:1")
	if a1 != Pause || a2 != Pause || len(b.host.calls) != calls+1 || b.host.counters[MetricLeaseWaited] != 2 {
		t.Fatalf("actions %d %d, %d calls, %d waited", a1, a2, len(b.host.calls)-calls, b.host.counters[MetricLeaseWaited])
	}
	return first, w1, w2, calls
}

// TestWaitThenCall: the call waited for brings no quota: the waiters call,
// each (none waits twice). No request is admitted without a call or a
// quota.
func TestWaitThenCall(t *testing.T) {
	b := newTestbed(t, quotaConfig)
	spentPool(t, b)
	req := map[string]string{":method": "GET", ":path": "/"}
	calls := len(b.host.calls)
	b.request(req, "10.0.0.1:1")
	w1, _ := b.request(req, "10.0.0.1:1")
	w2, _ := b.request(req, "10.0.0.1:1")
	b.deliver(okNoQuota(t))
	h := b.host
	if len(h.calls) != calls+3 || h.calls[len(h.calls)-2].stream != w1 || h.calls[len(h.calls)-1].stream != w2 || h.resumed[w1] != 0 || h.resumed[w2] != 0 {
		t.Fatalf("%d calls (want the two waiters'), resumed %d %d", len(h.calls)-calls, h.resumed[w1], h.resumed[w2])
	}
	b.deliverCall(len(h.calls)-2, okNoQuota(t))
	b.deliverCall(len(h.calls)-1, okNoQuota(t))
	if h.resumed[w1] != 1 || h.resumed[w2] != 1 {
		t.Fatalf("the waiters' answers: resumed %d %d", h.resumed[w1], h.resumed[w2])
	}
}

// TestWaitEndsWithStream: a waiting request whose stream ends is neither
// resumed nor called for.
func TestWaitEndsWithStream(t *testing.T) {
	b := newTestbed(t, quotaConfig)
	spentPool(t, b)
	req := map[string]string{":method": "GET", ":path": "/"}
	calls := len(b.host.calls)
	b.request(req, "10.0.0.1:1")
	w, _ := b.request(req, "10.0.0.1:1")
	b.ended(w)
	b.ended(w)
	b.close(w)
	b.deliver(okNoQuota(t))
	if len(b.host.calls) != calls+1 || b.host.resumed[w] != 0 {
		t.Fatalf("%d calls, resumed %d", len(b.host.calls)-calls, b.host.resumed[w])
	}
}

// TestWaitOnlyForLeased: a descriptor the proxy holds no lease pool for
// never waits: two requests under way at once each call.
func TestWaitOnlyForLeased(t *testing.T) {
	b := newTestbed(t, quotaConfig)
	spentPool(t, b)
	req := map[string]string{":method": "GET", ":path": "/"}
	calls := len(b.host.calls)
	b.request(req, "10.0.0.2:1")
	if _, a := b.request(req, "10.0.0.2:1"); a != Pause || len(b.host.calls) != calls+2 || b.host.counters[MetricLeaseWaited] != 0 {
		t.Fatalf("action %d, %d calls, %d waited", a, len(b.host.calls)-calls, b.host.counters[MetricLeaseWaited])
	}
}

// TestWaitBoundedByTimeout: a call the proxy never answers is given up on
// the tick (the failure mode applies to its request), and its waiter
// calls then, itself.
func TestWaitBoundedByTimeout(t *testing.T) {
	b := newTestbed(t, quotaConfig)
	spentPool(t, b)
	req := map[string]string{":method": "GET", ":path": "/"}
	calls := len(b.host.calls)
	b.request(req, "10.0.0.1:1")
	w, _ := b.request(req, "10.0.0.1:1")
	b.tick(2 * time.Second) // past the 25 ms timeout and the 1 s grace
	h := b.host
	if len(h.calls) != calls+2 || h.calls[len(h.calls)-1].stream != w {
		t.Fatalf("%d calls after the timeout (want the waiter's own)", len(h.calls)-calls)
	}
}

// TestWaitForAnotherVM: the pool is spent; a request on one VM calls, a
// request on another VM waits for that call (the pool's slot says it is
// under way), looking at the pool on a 1 ms tick: the call's quota admits
// it without a call of its own. When the call brings none, the waiter
// calls on its next tick.
func TestWaitForAnotherVM(t *testing.T) {
	for _, quota := range []bool{true, false} {
		vms, _ := leaseVMs(t, 2)
		b0, b1 := vms[0], vms[1]
		spentPool(t, b0)
		tick(vms) // b1 learns that the proxy holds leases
		req := map[string]string{":method": "GET", ":path": "/"}
		b0.request(req, "10.0.0.1:1")
		w, a := b1.request(req, "10.0.0.1:1")
		if a != Pause || len(b1.host.calls) != 0 || b1.host.counters[MetricLeaseWaited] != 1 || b1.host.tick != uint32(waitTick/1_000_000) {
			t.Fatalf("action %d, %d calls, %d waited, tick %d ms", a, len(b1.host.calls), b1.host.counters[MetricLeaseWaited], b1.host.tick)
		}
		b1.tick(time.Millisecond)
		if len(b1.host.calls) != 0 || b1.host.resumed[w] != 0 {
			t.Fatal("the waiter did not wait for the call under way")
		}
		if quota {
			b0.deliver(quotaAnswer(t, b0.host, 5, time.Second))
		} else {
			b0.deliver(okNoQuota(t))
		}
		b1.tick(time.Millisecond)
		switch {
		case quota && (b1.host.resumed[w] != 1 || len(b1.host.calls) != 0 || b1.host.counters[MetricQuotaAllowed] != 1):
			t.Fatalf("with a quota: resumed %d, %d calls", b1.host.resumed[w], len(b1.host.calls))
		case !quota && (b1.host.resumed[w] != 0 || len(b1.host.calls) != 1):
			t.Fatalf("without a quota: resumed %d, %d calls", b1.host.resumed[w], len(b1.host.calls))
		}
		if b1.host.tick == uint32(waitTick/1_000_000) {
			t.Fatal("the 1 ms tick outlived the wait")
		}
	}
}

// TestNoWaitForFailedCall: a call that could not be made is not waited
// for by the other VMs.
func TestNoWaitForFailedCall(t *testing.T) {
	vms, _ := leaseVMs(t, 2)
	b0, b1 := vms[0], vms[1]
	spentPool(t, b0)
	tick(vms)
	req := map[string]string{":method": "GET", ":path": "/"}
	b0.host.callErr = errors.New("no cluster")
	b0.request(req, "10.0.0.1:1")
	if _, a := b1.request(req, "10.0.0.1:1"); a != Pause || len(b1.host.calls) != 1 || b1.host.counters[MetricLeaseWaited] != 0 {
		t.Fatalf("action %d, %d calls, %d waited", a, len(b1.host.calls), b1.host.counters[MetricLeaseWaited])
	}
}

// TestWaitForCallGRPC: over proxy_grpc_call too, the answer of the call
// waited for wakes its waiters at once (their quota admits them), and a
// failed call sends each waiter to call itself, without waiting for the
// tick.
func TestWaitForCallGRPC(t *testing.T) {
	cfg := strings.Replace(quotaConfig, `"domain"`, `"transport": "grpc", "domain"`, 1)
	b := newTestbed(t, cfg)
	spentPool(t, b)
	req := map[string]string{":method": "GET", ":path": "/"}
	first, _ := b.request(req, "10.0.0.1:1")
	w1, a1 := b.request(req, "10.0.0.1:1")
	if a1 != Pause || b.host.counters[MetricLeaseWaited] != 1 {
		t.Fatalf("action %d, %d waited", a1, b.host.counters[MetricLeaseWaited])
	}
	calls := len(b.host.calls)
	b.receiveGRPC(marshal(t, &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{
			Code: rlsv3.RateLimitResponse_OK,
			Quota: &rlsv3.RateLimitResponse_Quota{Requests: 5, ExpirationSpecifier: &rlsv3.RateLimitResponse_Quota_ValidUntil{
				ValidUntil: timestamppb.New(time.Unix(0, b.host.WallNow()+int64(time.Second)))}},
		}},
	}))
	if h := b.host; h.resumed[first] != 1 || h.resumed[w1] != 1 || len(h.calls) != calls {
		t.Fatalf("after the answer: resumed %d %d, %d calls more", h.resumed[first], h.resumed[w1], len(h.calls)-calls)
	}

	// The pool spent again; the call waited for fails: the waiter calls.
	for range 3 {
		b.request(req, "10.0.0.1:1")
	}
	caller, _ := b.request(req, "10.0.0.1:1")
	w2, a2 := b.request(req, "10.0.0.1:1")
	if a2 != Pause {
		t.Fatalf("second waiter: action %d", a2)
	}
	calls = len(b.host.calls)
	b.closeGRPC(14, "unavailable")
	if len(b.host.calls) != calls+1 {
		t.Fatalf("after the failed call (stream %d): %d calls more, want the waiter's (stream %d) own", caller, len(b.host.calls)-calls, w2)
	}
}

// TestCancelWakesWaiters: the stream whose call two requests wait for ends
// and its proxy cancels the call (a native host's stream callout dies with
// its stream): the caller is counted nowhere, nothing is sent to it, and
// the waiters wake at once and call themselves.
func TestCancelWakesWaiters(t *testing.T) {
	b := newTestbed(t, quotaConfig)
	first, w1, w2, calls := callAndWaiters(t, b)
	id := b.lastCall().id
	before := map[string]int64{}
	for k, v := range b.host.counters {
		before[k] = v
	}
	b.ended(first)
	b.w.Cancel(id)
	b.close(first)
	h := b.host
	if len(h.calls) != calls+3 || h.calls[len(h.calls)-2].stream != w1 || h.calls[len(h.calls)-1].stream != w2 {
		t.Fatalf("%d calls after the cancel, want the two waiters' own", len(h.calls)-calls-1)
	}
	for _, m := range []string{MetricAllowed, MetricErrors, MetricFailureOpen, MetricFailureClosed, MetricOverLimit} {
		if h.counters[m] != before[m] {
			t.Errorf("%s counted the cancelled call: %d -> %d", m, before[m], h.counters[m])
		}
	}
	if h.resumed[first] != 0 || len(h.local) != 0 {
		t.Fatalf("the cancelled stream was acted on: resumed %d, %d local replies", h.resumed[first], len(h.local))
	}
	// Its answer, were it to come, is ignored; a second cancel too.
	b.answerCall(id, okNoQuota(t))
	b.w.Cancel(id)
	if h.counters[MetricAllowed] != before[MetricAllowed] {
		t.Fatal("an answer to a cancelled call was counted")
	}
}
