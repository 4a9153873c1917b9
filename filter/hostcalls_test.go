package main

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
)

// TestPrecheckRejectionHostCalls counts the host functions filter.wasm calls
// for a request its precheck rejects, over the whole stream (context
// create, request and response headers, log, done, delete), with the
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
		h.call("proxy_on_log", uint64(id))
		h.call("proxy_on_done", uint64(id))
		h.call("proxy_on_delete", uint64(id))
	}
	stream(3) // warm: buffers and the reply cache reach their size
	locals := h.nLocals
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
