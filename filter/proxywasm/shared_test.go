package main

import (
	"context"
	"fmt"
	"maps"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluicehq/sluice/filter/core/rlsproto"
	"github.com/sluicehq/sluice/filter/proxywasm/shareddata"
)

// sharedConfig has one descriptor from x-user, so that a test can churn
// through keys.
const sharedConfig = `{"cluster": "rls", "domain": "bench", "timeout": "100ms",
	"rate_limits": [{"actions": [{"request_headers": {"header_name": "x-user", "descriptor_key": "user"}}]}],
	"precheck": {"enabled": true}, "headers": {"draft10": true, "retry_after": true}}`

// hourDenial is the control plane's OVER_LIMIT for one descriptor, an hour
// from its reset.
func hourDenial(tb testing.TB) *hostAnswer {
	return overLimitAnswer(tb, []time.Duration{time.Hour}, []any{
		map[string]any{"algorithm": "fixed_window", "limit": 1, "window_ms": 3600e3, "retry_after_ms": 3600e3},
	})
}

// hostCounter counts the host functions filter.wasm calls while counting
// is on (the guest's own functions aside).
type hostCounter struct {
	counts   map[string]int
	counting bool
	// now is the monotonic clock of the hosts made with context or clock
	// (clockKey): it stands still unless the test moves it.
	now int64
}

// clock returns a context giving a host c's clock, for the VMs whose host
// calls c does not count.
func (c *hostCounter) clock() context.Context {
	if c.now == 0 {
		c.now = 1000e9
	}
	return context.WithValue(context.Background(), clockKey{}, &c.now)
}

func (c *hostCounter) context() context.Context {
	c.counts = map[string]int{}
	return experimental.WithFunctionListenerFactory(c.clock(),
		experimental.FunctionListenerFactoryFunc(func(def api.FunctionDefinition) experimental.FunctionListener {
			if def.GoFunction() == nil {
				return nil
			}
			name := def.DebugName()
			return experimental.FunctionListenerFunc(func(context.Context, api.Module, api.FunctionDefinition, []uint64, experimental.StackIterator) {
				if c.counting {
					c.counts[name]++
				}
			})
		}))
}

// TestSharedBlockAcrossVMs runs two filter.wasm VMs of one proxy (one
// shared data): VM A hears the control plane deny user "flood"; VM B,
// which never asked, rejects it with no call, reading the shared data
// once; from then on B rejects it with the host calls of any precheck
// rejection (TestPrecheckRejectionHostCalls), no read of the shared data.
// A VM started afterwards (as after FAIL_RELOAD replaced a trapped one:
// the shared data outlives VMs) rejects it too.
func TestSharedBlockAcrossVMs(t *testing.T) {
	shared := newHostShared()
	var c hostCounter
	a, b := twoVMs(t, shared, &c)
	req := map[string]string{":method": "GET", ":path": "/", "x-user": "flood"}
	a.request(2, req)
	a.deliver(1, hourDenial(t))
	if a.locals[2] != 429 {
		t.Fatalf("A: no 429: %v", a.logs)
	}
	a.finish(2)

	stream := func(h *wasmHost, id uint32) {
		h.headers[id], h.current = req, id
		h.call("proxy_on_context_create", uint64(id), 1)
		h.call("proxy_on_request_headers", uint64(id), uint64(len(req)), 1)
		h.call("proxy_on_response_headers", uint64(id), 3, 0)
		h.call("proxy_on_log", uint64(id))
		h.call("proxy_on_done", uint64(id))
		h.call("proxy_on_delete", uint64(id))
	}
	b.call("sluice_test_gc") // no collection starts in the window
	c.counting = true
	stream(b, 2)
	c.counting = false
	if len(b.calls) != 0 || b.locals[2] != 429 {
		t.Fatalf("B: %d calls, local %d; logs %v", len(b.calls), b.locals[2], b.logs)
	}
	first := map[string]int{
		"env.proxy_get_header_map_value":        1, // x-user
		"wasi_snapshot_preview1.clock_time_get": 1,
		"env.proxy_get_shared_data":             2, // the live mark (A's block is live), the slot
		"env.proxy_increment_metric":            2, // sluice.precheck_rejected, sluice.precheck_shared
		"env.proxy_send_local_response":         1,
	}
	if !maps.Equal(c.counts, first) {
		t.Fatalf("host calls of B's first rejection: %v, want %v", c.counts, first)
	}
	stream(b, 3) // warm: the reply cache
	b.call("sluice_test_gc")
	c.counts = map[string]int{}
	c.counting = true
	stream(b, 4)
	c.counting = false
	later := map[string]int{
		"env.proxy_get_header_map_value":        1,
		"wasi_snapshot_preview1.clock_time_get": 1,
		"env.proxy_increment_metric":            1,
		"env.proxy_send_local_response":         1,
	}
	if !maps.Equal(c.counts, later) || len(b.calls) != 0 {
		t.Fatalf("host calls of B's later rejections: %v, want %v (%d calls)", c.counts, later, len(b.calls))
	}

	// A trapped VM's replacement: A's module is gone, a new one starts.
	a.runtime.Close(a.ctx)
	r := newWasmHostShared(t, c.clock(), filterWasm, sharedConfig, shared)
	if !r.configure() {
		t.Fatalf("configuration refused: %v", r.logs)
	}
	r.request(2, req)
	if len(r.calls) != 0 || r.locals[2] != 429 {
		t.Fatalf("the VM after a reload: %d calls, local %d", len(r.calls), r.locals[2])
	}
	// Another user is asked about as before.
	r.request(3, map[string]string{":method": "GET", ":path": "/", "x-user": "other"})
	if len(r.calls) != 1 {
		t.Fatalf("another user: %d calls", len(r.calls))
	}
}

// TestSharedDataBoundedUnderChurn has one VM hear 3 x Slots distinct users
// denied: the proxy's shared data never holds more than Slots slots and
// the seed, within shareddata.Bound bytes.
func TestSharedDataBoundedUnderChurn(t *testing.T) {
	shared := newHostShared()
	h := newWasmHostShared(t, context.Background(), filterWasm, sharedConfig, shared)
	if !h.configure() {
		t.Fatalf("configuration refused: %v", h.logs)
	}
	h.quiet = true
	denial := hourDenial(t)
	const users = 3 * shareddata.Slots
	for i := range users {
		id := uint32(2 + i)
		h.request(id, map[string]string{":method": "GET", ":path": "/", "x-user": fmt.Sprintf("user-%d", i)})
		h.deliver(uint32(len(h.calls)), denial)
		h.finish(id)
	}
	if len(h.calls) != users {
		t.Fatalf("%d calls for %d users", len(h.calls), users)
	}
	keys, bytes := shared.size()
	if keys > shareddata.Slots+1 || bytes > shareddata.Bound(shareddata.Slots) {
		t.Fatalf("%d keys, %d bytes in the shared data after %d users; bound %d keys, %d bytes",
			keys, bytes, users, shareddata.Slots+1, shareddata.Bound(shareddata.Slots))
	}
	t.Logf("%d users denied: %d shared keys, %d bytes (bound %d)", users, keys, bytes, shareddata.Bound(shareddata.Slots))
}

// TestCalloutHostCalls counts the host calls of a request the filter sends
// to the control plane, over its whole stream, when the answer admits it
// and when it denies it: what sharing costs on the path that calls out.
// With no block live in the proxy, no slot is read before the call: the
// VM read the proxy's live mark less than shareddata.LiveRefresh ago
// (then it reads the mark again, one proxy_get_shared_data); a denial that
// blocks is published with one read and one compare-and-swap write of its
// slot, and of the live mark. An admission reads the clock once, at the
// request: the precheck's charge of it waits for the next time read
// (precheck.Table.RecordAdmitted); a denial reads it at the answer too.
func TestCalloutHostCalls(t *testing.T) {
	var c hostCounter
	h := newWasmHostShared(t, c.context(), filterWasmDev, sharedConfig, newHostShared())
	if !h.configure() {
		t.Fatalf("configuration refused: %v", h.logs)
	}
	admitted := hostAdmittedOne(t)
	run := func(id uint32, user string, answer *hostAnswer) map[string]int {
		return c.callout(h, id, user, func(call uint32) { h.deliver(call, answer) })
	}
	run(2, "warm", admitted)
	common := map[string]int{
		"env.proxy_get_header_map_value":        2, // x-user; the answer's grpc-status (trailer)
		"wasi_snapshot_preview1.clock_time_get": 1, // the request (and a denial's answer)
		"env.proxy_http_call":                   1,
		"env.proxy_set_effective_context":       1,
		"env.proxy_get_buffer_bytes":            1, // the answer's body
		"env.proxy_increment_metric":            1, // sluice.allowed or sluice.over_limit
	}
	wantOK := maps.Clone(common)
	wantOK["env.proxy_continue_stream"] = 1
	wantOK["env.proxy_add_header_map_value"] = 2 // RateLimit-Policy, RateLimit
	if got := run(3, "u1", admitted); !maps.Equal(got, wantOK) {
		t.Errorf("host calls of an admitted request: %v, want %v", got, wantOK)
	}
	c.now += shareddata.LiveRefresh
	wantRefresh := maps.Clone(wantOK)
	wantRefresh["env.proxy_get_shared_data"] = 1 // the live mark, read again: no block is live
	if got := run(5, "u3", admitted); !maps.Equal(got, wantRefresh) {
		t.Errorf("host calls of an admitted request LiveRefresh later: %v, want %v", got, wantRefresh)
	}
	wantDenied := maps.Clone(common)
	wantDenied["env.proxy_send_local_response"] = 1
	wantDenied["wasi_snapshot_preview1.clock_time_get"]++ // a block's end, from the answer's arrival
	wantDenied["env.proxy_get_shared_data"] = 2           // the slot and the live mark, before their writes
	wantDenied["env.proxy_set_shared_data"] = 2
	if got := run(4, "u2", hourDenial(t)); !maps.Equal(got, wantDenied) {
		t.Errorf("host calls of a denied request: %v, want %v; logs %q", got, wantDenied, h.logs)
	}
}

// hostAdmittedOne is the control plane's OK for one descriptor, with its
// limit (so that the response carries rate limit headers).
func hostAdmittedOne(tb testing.TB) *hostAnswer {
	limit := map[string]any{"algorithm": "fixed_window", "limit": 1000, "window_ms": 3600e3}
	meta, err := structpb.NewStruct(map[string]any{rlsproto.MetadataKey: []any{limit}})
	if err != nil {
		tb.Fatal(err)
	}
	return &hostAnswer{
		headers:  map[string]string{":status": "200"},
		trailers: map[string]string{"grpc-status": "0"},
		body: grpcAnswer(tb, &rlsv3.RateLimitResponse{
			OverallCode:     rlsv3.RateLimitResponse_OK,
			Statuses:        []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: 1, LimitRemaining: 999}},
			DynamicMetadata: meta,
		}),
	}
}

// twoVMs starts two configured VMs of filter.wasm on one proxy's shared
// data, as two workers of one Envoy; the second's host calls are counted
// in c.
func twoVMs(t *testing.T, shared *hostShared, c *hostCounter) (a, b *wasmHost) {
	t.Helper()
	a = newWasmHostShared(t, c.clock(), filterWasmDev, sharedConfig, shared)
	b = newWasmHostShared(t, c.context(), filterWasmDev, sharedConfig, shared)
	for _, h := range []*wasmHost{a, b} {
		if !h.configure() {
			t.Fatalf("configuration refused: %v", h.logs)
		}
	}
	return a, b
}
