package main

import (
	"context"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"

	"github.com/sluicehq/sluice/filter/proxywasm/abi"
)

// TestPrecheckRejectionHostCalls counts the host functions filter.wasm calls
// for a request its precheck rejects, over the whole stream (context
// create, request and response headers, response body and trailers, log,
// done, delete), with the
// configuration of bench-envoy's setup 4. In Envoy each host call costs
// microseconds (reading one header costs about 2.8 us, the host calling
// back to allocate), more than the filter's own code: bench-envoy's setup
// 2r makes exactly these calls from an empty Go filter, as the floor that
// sluice's filter cost is measured against. A new host call on this path
// fails here first.
func TestPrecheckRejectionHostCalls(t *testing.T) {
	counts := map[string]int{}
	counting := false
	ctx := experimental.WithFunctionListenerFactory(context.Background(),
		experimental.FunctionListenerFactoryFunc(func(def api.FunctionDefinition) experimental.FunctionListener {
			if def.GoFunction() == nil {
				return nil // the guest's own functions; host functions are Go
			}
			name := def.DebugName()
			return experimental.FunctionListenerFunc(func(context.Context, api.Module, api.FunctionDefinition, []uint64, experimental.StackIterator) {
				if counting {
					counts[name]++
				}
			})
		}))
	const config = `{"cluster": "rls", "domain": "bench", "timeout": "100ms",
		"rate_limits": [{"actions": [{"request_headers": {"header_name": "x-user", "descriptor_key": "user"}}]}],
		"precheck": {"enabled": true}, "headers": {"draft10": true, "retry_after": true}}`
	h := newWasmHostIn(t, ctx, filterWasmDev, config)
	if !h.configure() {
		t.Fatalf("configuration refused: %v", h.logs)
	}
	req := map[string]string{":method": "GET", ":path": "/", ":authority": "example.com", "x-user": "blocked"}
	h.request(2, req)
	h.deliver(1, overLimitAnswer(t, []time.Duration{time.Hour}, []any{
		map[string]any{"algorithm": "fixed_window", "limit": 1, "window_ms": 3600e3, "retry_after_ms": 3600e3},
	}))
	h.finish(2)
	stream := func(id uint32) {
		h.headers[id], h.current = req, id
		h.call("proxy_on_context_create", uint64(id), 1)
		h.call("proxy_on_request_headers", uint64(id), uint64(len(req)), 1)
		h.call("proxy_on_response_headers", uint64(id), 3, 0)
		h.call("proxy_on_response_body", uint64(id), 100, 0)
		h.call("proxy_on_response_body", uint64(id), 100, 1)
		h.call("proxy_on_response_trailers", uint64(id), 1)
		h.call("proxy_on_log", uint64(id))
		h.call("proxy_on_done", uint64(id))
		h.call("proxy_on_delete", uint64(id))
	}
	stream(3) // warm: buffers and the reply cache reach their size
	locals := h.nLocals
	h.call("sluice_test_gc") // no collection starts in the window
	counting = true
	stream(4)
	counting = false
	if h.nLocals != locals+1 || len(h.calls) != 1 {
		t.Fatalf("the precheck did not reject: %d local replies, %d calls", h.nLocals-locals, len(h.calls))
	}
	want := map[string]int{
		"env.proxy_get_header_map_value":        1, // x-user
		"wasi_snapshot_preview1.clock_time_get": 1,
		"env.proxy_increment_metric":            1, // sluice.precheck_rejected
		"env.proxy_send_local_response":         1,
	}
	if !maps.Equal(counts, want) {
		t.Fatalf("host calls of a precheck rejection: %v, want %v", counts, want)
	}
}

// TestLeaseSpendHostCalls counts the host functions filter.wasm calls for
// a request admitted from a lease another VM of the proxy received: one
// read and one compare-and-swap write of the pool's slot, on top of what
// any request decided in the filter makes (the header, the clock, the
// counter). A new host call on this path fails here first.
func TestLeaseSpendHostCalls(t *testing.T) {
	shared := newHostShared()
	var c hostCounter
	a, b := twoVMs(t, shared, &c)
	req := map[string]string{":method": "GET", ":path": "/", "x-user": "leased"}
	hearLease(t, a, b)
	if leaseStream(b, 3, req) != uint64(abi.ActionContinue) { // warm
		t.Fatalf("B did not spend A's lease: %v", b.logs)
	}
	b.call("sluice_test_gc") // no collection starts in the window
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
	// pools: the lease map says its slot holds no pool, so no slot is read
	// (TestSpreadLeaseHostCalls), then the call (no block is live in the
	// proxy: the block's slot is not read either).
	other := map[string]string{":method": "GET", ":path": "/", "x-user": "other"}
	leaseStream(b, 5, other) // warm: the call's buffers
	b.call("sluice_test_gc")
	c.counts = map[string]int{}
	c.counting = true
	leaseStream(b, 6, other)
	c.counting = false
	call := map[string]int{
		"env.proxy_get_header_map_value":        1,
		"wasi_snapshot_preview1.clock_time_get": 1,
		"env.proxy_http_call":                   1,
	}
	if !maps.Equal(c.counts, call) {
		t.Fatalf("host calls of a request that calls out: %v, want %v", c.counts, call)
	}
}

// TestGRPCCalloutHostCalls counts the host calls of a request sent to the
// control plane over proxy_grpc_call (transport "grpc") and admitted, over
// its whole stream: the proxy's gRPC client checks the answer's HTTP and
// gRPC statuses itself, so the filter reads no header of the answer (one
// host call, and its callback to allocate, fewer than over proxy_http_call;
// see TestCalloutHostCalls).
func TestGRPCCalloutHostCalls(t *testing.T) {
	var c hostCounter
	config := strings.Replace(sharedConfig, `"domain"`, `"transport": "grpc", "domain"`, 1)
	h := newWasmHostShared(t, c.context(), filterWasmDev, config, newHostShared())
	if !h.configure() {
		t.Fatalf("configuration refused: %v", h.logs)
	}
	msg := hostAdmittedOne(t).body[5:] // unframed
	run := func(id uint32, user string) map[string]int {
		return c.callout(h, id, user, func(call uint32) { h.deliverGRPC(call, msg) })
	}
	run(2, "warm")
	want := map[string]int{
		"env.proxy_get_header_map_value":        1, // x-user
		"wasi_snapshot_preview1.clock_time_get": 1, // the request; an admission's charge waits for the next
		"env.proxy_grpc_call":                   1, // (no block live in the proxy: no slot read)
		"env.proxy_set_effective_context":       1,
		"env.proxy_get_buffer_bytes":            1, // the response message
		"env.proxy_increment_metric":            1, // sluice.allowed
		"env.proxy_continue_stream":             1,
		"env.proxy_add_header_map_value":        2, // RateLimit-Policy, RateLimit
	}
	if got := run(3, "u1"); !maps.Equal(got, want) || h.resumed[3] != 1 || h.grpcCalls != 2 {
		t.Errorf("host calls of an admitted request: %v, want %v (resumed %d, %d gRPC calls)", got, want, h.resumed[3], h.grpcCalls)
	}
}

// callout counts the host calls of one whole request of user on h, stream
// id, that calls out and gets its answer from deliver (given the call's
// id), after a garbage collection so that none starts in the window.
func (c *hostCounter) callout(h *wasmHost, id uint32, user string, deliver func(call uint32)) map[string]int {
	req := map[string]string{":method": "GET", ":path": "/", "x-user": user}
	h.call("sluice_test_gc")
	c.counts = map[string]int{}
	c.counting = true
	h.calloutStream(id, req, deliver)
	c.counting = false
	return c.counts
}

// calloutStream runs one whole stream of req on h, stream id, whose request
// calls the control plane and gets its answer from deliver (given the
// call's id).
func (h *wasmHost) calloutStream(id uint32, req map[string]string, deliver func(call uint32)) {
	h.headers[id], h.current = req, id
	h.call("proxy_on_context_create", uint64(id), 1)
	h.call("proxy_on_request_headers", uint64(id), uint64(len(req)), 1)
	deliver(uint32(len(h.calls)))
	h.current = id
	h.call("proxy_on_response_headers", uint64(id), 3, 0)
	h.call("proxy_on_log", uint64(id))
	h.call("proxy_on_done", uint64(id))
	h.call("proxy_on_delete", uint64(id))
}

// hearLease has VM a receive a lease (user "leased") and VM b hear of it
// on its tick, as two workers of one proxy.
func hearLease(t *testing.T, a, b *wasmHost) {
	a.request(2, map[string]string{":method": "GET", ":path": "/", "x-user": "leased"})
	a.deliver(1, leaseAnswer(t, 100))
	a.finish(2)
	b.current = 1
	b.call("proxy_on_tick", 1)
}
