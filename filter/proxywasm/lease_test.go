package main

import (
	"context"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/sluicehq/sluice/filter/proxywasm/abi"
)

// leaseAnswer is the control plane's OK answer for one descriptor with a
// quota (lease) of n requests valid for an hour.
func leaseAnswer(tb testing.TB, n uint32) *hostAnswer {
	return &hostAnswer{
		headers:  map[string]string{":status": "200"},
		trailers: map[string]string{"grpc-status": "0"},
		body: grpcAnswer(tb, &rlsv3.RateLimitResponse{
			OverallCode: rlsv3.RateLimitResponse_OK,
			Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{
				Code: rlsv3.RateLimitResponse_OK,
				Quota: &rlsv3.RateLimitResponse_Quota{Requests: n, ExpirationSpecifier: &rlsv3.RateLimitResponse_Quota_ValidUntil{
					ValidUntil: timestamppb.New(time.Now().Add(time.Hour))}},
			}},
		}),
	}
}

// leaseStream runs one whole stream of req on h and returns the action of
// its request headers.
func leaseStream(h *wasmHost, id uint32, req map[string]string) uint64 {
	h.headers[id], h.current = req, id
	h.call("proxy_on_context_create", uint64(id), 1)
	action := h.call("proxy_on_request_headers", uint64(id), uint64(len(req)), 1)
	h.call("proxy_on_response_headers", uint64(id), 3, 0)
	h.call("proxy_on_log", uint64(id))
	h.call("proxy_on_done", uint64(id))
	h.call("proxy_on_delete", uint64(id))
	delete(h.headers, id)
	return action
}

// TestLeaseOutlivesAReload: the pool is the proxy's, not a VM's: a VM
// that replaces one that trapped (FAIL_RELOAD) spends what is left of the
// lease the trapped one received, and no unit twice.
func TestLeaseOutlivesAReload(t *testing.T) {
	const granted = 10
	shared := newHostShared()
	a := newWasmHostShared(t, context.Background(), filterWasm, sharedConfig, shared)
	if !a.configure() {
		t.Fatalf("configuration refused: %v", a.logs)
	}
	req := map[string]string{":method": "GET", ":path": "/", "x-user": "leased"}
	a.request(2, req)
	a.deliver(1, leaseAnswer(t, granted+1))
	a.finish(2)
	spent := 0
	for id := range uint32(4) {
		if leaseStream(a, 10+id, req) == uint64(abi.ActionContinue) {
			spent++
		}
	}
	a.runtime.Close(a.ctx)
	r := newWasmHostShared(t, context.Background(), filterWasm, sharedConfig, shared)
	if !r.configure() {
		t.Fatalf("configuration refused: %v", r.logs)
	}
	r.current = 1
	r.call("proxy_on_tick", 1)
	for id := range uint32(2 * granted) {
		if leaseStream(r, 10+id, req) == uint64(abi.ActionContinue) {
			spent++
		}
	}
	if spent != granted {
		t.Fatalf("%d units spent of %d across the reload", spent, granted)
	}
}

// TestLeaseVMsConcurrently: four filter.wasm VMs of one proxy, each on its
// own goroutine (Envoy's workers), send requests for one descriptor while
// one lease of the proxy lasts: the requests admitted without a call add
// up to the units granted, exactly, whatever the interleaving; the others
// wait for a call under way for the descriptor (plugin/wait.go: the
// proxy's pool records the one call of all its VMs) or make it: with no
// answer delivered here, one call more than the first, at most one per VM.
func TestLeaseVMsConcurrently(t *testing.T) {
	const vms, perVM, granted = 4, 200, 300
	shared := newHostShared()
	hosts := make([]*wasmHost, vms)
	for i := range hosts {
		hosts[i] = newWasmHostShared(t, context.Background(), filterWasm, sharedConfig, shared)
		if !hosts[i].configure() {
			t.Fatalf("configuration refused: %v", hosts[i].logs)
		}
	}
	req := map[string]string{":method": "GET", ":path": "/", "x-user": "leased"}
	hosts[0].request(2, req)
	hosts[0].deliver(1, leaseAnswer(t, granted+1)) // the answered request takes one
	hosts[0].finish(2)
	for _, h := range hosts {
		h.current = 1
		h.call("proxy_on_tick", 1)
	}
	admitted := make([]int, vms)
	var wg sync.WaitGroup
	for i, h := range hosts {
		wg.Go(func() {
			h.quiet = true
			for id := range uint32(perVM) {
				if leaseStream(h, 10+id, req) == uint64(abi.ActionContinue) {
					admitted[i]++
				}
			}
		})
	}
	wg.Wait()
	total, calls := 0, 0
	for i, h := range hosts {
		total += admitted[i]
		calls += len(h.calls)
	}
	t.Logf("admitted from the lease by VM: %v; %d calls", admitted, calls)
	if total != granted {
		t.Fatalf("the VMs admitted %d requests from a lease of %d units", total, granted)
	}
	if calls < 2 || calls > 1+vms {
		t.Fatalf("%d calls once the lease ran out, want 2 to %d: one under way at a time, which the others wait for", calls, 1+vms)
	}
}
