package main

import (
	"context"
	"maps"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/sluicehq/sluice/filter/abi"
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

// TestLeaseSpendHostCalls counts the host functions filter.wasm calls for
// a request admitted from a lease another VM of the proxy received: one
// read and one compare-and-swap write of the pool's slot, on top of what
// any request decided in the filter makes (the header, the clock, the
// counter). A new host call on this path fails here first.
func TestLeaseSpendHostCalls(t *testing.T) {
	shared := newHostShared()
	var c hostCounter
	a := newWasmHostShared(t, context.Background(), filterWasmDev, sharedConfig, shared)
	b := newWasmHostShared(t, c.context(), filterWasmDev, sharedConfig, shared)
	for _, h := range []*wasmHost{a, b} {
		if !h.configure() {
			t.Fatalf("configuration refused: %v", h.logs)
		}
	}
	req := map[string]string{":method": "GET", ":path": "/", "x-user": "leased"}
	a.request(2, req)
	a.deliver(1, leaseAnswer(t, 100))
	a.finish(2)
	b.current = 1
	b.call("proxy_on_tick", 1)                                // B hears of leases
	if leaseStream(b, 3, req) != uint64(abi.ActionContinue) { // warm
		t.Fatalf("B did not spend A's lease: %v", b.logs)
	}
	c.counting = true
	action := leaseStream(b, 4, req)
	c.counting = false
	if action != uint64(abi.ActionContinue) || len(b.calls) != 0 {
		t.Fatalf("B: action %d, %d calls", action, len(b.calls))
	}
	want := map[string]int{
		"env.proxy_get_header_map_value":        1, // x-user
		"wasi_snapshot_preview1.clock_time_get": 1,
		"env.proxy_get_shared_data":             1, // the pool's slot
		"env.proxy_set_shared_data":             1, // one unit less, by CAS
		"env.proxy_increment_metric":            1, // sluice.quota_allowed
	}
	if !maps.Equal(c.counts, want) {
		t.Fatalf("host calls of a request spent from the shared lease: %v, want %v", c.counts, want)
	}
	// A request of a descriptor with no lease, once the VM reads the
	// pools: one read of the pool's slot more than before leases (the
	// block's slot is read too), then the call.
	other := map[string]string{":method": "GET", ":path": "/", "x-user": "other"}
	leaseStream(b, 5, other) // warm: the call's buffers
	c.counts = map[string]int{}
	c.counting = true
	leaseStream(b, 6, other)
	c.counting = false
	call := map[string]int{
		"env.proxy_get_header_map_value":        1,
		"wasi_snapshot_preview1.clock_time_get": 1,
		"env.proxy_get_shared_data":             2, // the pool's slot, the block's slot
		"env.proxy_http_call":                   1,
	}
	if !maps.Equal(c.counts, call) {
		t.Fatalf("host calls of a request that calls out: %v, want %v", c.counts, call)
	}
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
// call the control plane.
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
	if calls != 1+vms*perVM-granted {
		t.Fatalf("%d calls, want %d", calls, 1+vms*perVM-granted)
	}
}
