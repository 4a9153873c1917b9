package main

import (
	"context"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluicehq/sluice/filter/core/headermap"
	"github.com/sluicehq/sluice/filter/core/rlsproto"
	"github.com/sluicehq/sluice/filter/proxywasm/abi"
)

// wasmHost is a minimal proxy-wasm host on wazero (compiler engine) for the
// allocation check and the benchmark: just the host functions filter.wasm
// imports, each cheap enough not to drown the guest's cost. The full
// Envoy-like test host lives in e2e.

const i32, i64 = api.ValueTypeI32, api.ValueTypeI64

// compiled caches the compiled module across the tests' runtimes.
var compiled = wazero.NewCompilationCache()

type wasmHost struct {
	tb      testing.TB
	ctx     context.Context
	runtime wazero.Runtime
	mod     api.Module
	stack   []uint64
	fn      map[string]api.Function
	malloc  api.Function // proxy_on_memory_allocate
	mstack  []uint64     // its stack

	config   []byte
	current  uint32
	headers  map[uint32]map[string]string
	remote   string
	answer   *hostAnswer
	calls    []uint32 // stream of each call, by call id - 1
	locals   map[uint32]uint32
	lastBody []byte
	resumed  map[uint32]int
	logs     []string
	quiet    bool // record nothing per request (benchmark)
	nLocals  int
	shared   *hostShared // the proxy's shared data; hosts of one test may share it
	// Per stream: response headers, trailers, properties (usage-based limits).
	respHeaders, respTrailers map[uint32]map[string]string
	props                     map[uint32]map[string][]byte
	// Per stream: the request body received so far, and the response
	// chunk being delivered (proxy_set_buffer_bytes replaces it).
	reqBody, respChunk      map[uint32][]byte
	callHeaders, callBodies [][]byte // of each call, unless quiet

	grpcCalls   int    // calls made over proxy_grpc_call
	grpcStatus  uint32 // the status of a gRPC call being closed
	grpcMessage string
}

type hostAnswer struct {
	headers, trailers map[string]string
	body              []byte
}

func newWasmHost(tb testing.TB, wasm []byte, config string) *wasmHost {
	tb.Helper()
	return newWasmHostIn(tb, context.Background(), wasm, config)
}

// newWasmHostIn is newWasmHost whose runtime and calls use ctx (for
// example one carrying a wazero function listener).
func newWasmHostIn(tb testing.TB, ctx context.Context, wasm []byte, config string) *wasmHost {
	tb.Helper()
	return newWasmHostShared(tb, ctx, wasm, config, newHostShared())
}

// clockKey is the context key of a test's monotonic clock (*int64, ns):
// a host made with a context carrying one gives the guest that clock, not
// the system's, so that what depends on the time that passes (the refresh
// of the shared blocks' live mark, shareddata.LiveRefresh) is the same
// in every run.
type clockKey struct{}

// newWasmHostShared is newWasmHostIn for a VM of a proxy whose shared data
// is shared: the hosts of one test given the same one are the VMs of one
// Envoy.
func newWasmHostShared(tb testing.TB, ctx context.Context, wasm []byte, config string, shared *hostShared) *wasmHost {
	tb.Helper()
	h := &wasmHost{shared: shared,
		tb: tb, ctx: ctx, config: []byte(config), stack: make([]uint64, 16), mstack: make([]uint64, 1),
		fn: map[string]api.Function{}, headers: map[uint32]map[string]string{},
		locals: map[uint32]uint32{}, resumed: map[uint32]int{}, remote: "198.51.100.4:5000",
		respHeaders: map[uint32]map[string]string{}, respTrailers: map[uint32]map[string]string{},
		props: map[uint32]map[string][]byte{}, reqBody: map[uint32][]byte{}, respChunk: map[uint32][]byte{},
	}
	h.runtime = wazero.NewRuntimeWithConfig(h.ctx, wazero.NewRuntimeConfigCompiler().WithCompilationCache(compiled))
	tb.Cleanup(func() { h.runtime.Close(h.ctx) })
	wasi_snapshot_preview1.MustInstantiate(h.ctx, h.runtime)
	b := h.runtime.NewHostModuleBuilder("env")
	export := func(name string, params []api.ValueType, f api.GoModuleFunc) {
		b.NewFunctionBuilder().WithGoModuleFunction(f, params, []api.ValueType{i32}).Export(name)
	}
	export("proxy_log", []api.ValueType{i32, i32, i32}, func(_ context.Context, m api.Module, s []uint64) {
		msg, _ := m.Memory().Read(uint32(s[1]), uint32(s[2]))
		h.logs = append(h.logs, string(msg))
		s[0] = 0
	})
	export("proxy_get_buffer_bytes", []api.ValueType{i32, i32, i32, i32, i32}, func(_ context.Context, m api.Module, s []uint64) {
		var buf []byte
		switch abi.BufferType(s[0]) {
		case abi.BufferPluginConfiguration:
			buf = h.config
		case abi.BufferCallResponseBody, abi.BufferGRPCCallMessage:
			buf = h.answer.body
		case abi.BufferRequestBody, abi.BufferResponseBody:
			buf = h.reqBody[h.current]
			if abi.BufferType(s[0]) == abi.BufferResponseBody {
				buf = h.respChunk[h.current]
			}
			start, n := min(int(uint32(s[1])), len(buf)), int(uint32(s[2]))
			buf = buf[start:min(len(buf), start+n)]
		}
		s[0] = h.give(m, buf, uint32(s[3]), uint32(s[4]))
	})
	export("proxy_set_buffer_bytes", []api.ValueType{i32, i32, i32, i32, i32}, func(_ context.Context, m api.Module, s []uint64) {
		// Envoy's rules: start 0 and length at least the size replace the
		// buffer; both 0 prepend; start past the end appends.
		data, _ := m.Memory().Read(uint32(s[3]), uint32(s[4]))
		cur := h.respChunk[h.current]
		switch start, length := int(uint32(s[1])), int(uint32(s[2])); {
		case abi.BufferType(s[0]) != abi.BufferResponseBody:
			s[0] = uint64(abi.StatusBadArgument)
			return
		case start == 0 && length == 0:
			h.respChunk[h.current] = append(append([]byte(nil), data...), cur...)
		case start == 0 && length >= len(cur):
			h.respChunk[h.current] = append([]byte(nil), data...)
		case start >= len(cur):
			h.respChunk[h.current] = append(cur, data...)
		default:
			s[0] = uint64(abi.StatusBadArgument)
			return
		}
		s[0] = 0
	})
	export("proxy_get_header_map_value", []api.ValueType{i32, i32, i32, i32, i32}, func(_ context.Context, m api.Module, s []uint64) {
		key, _ := m.Memory().Read(uint32(s[1]), uint32(s[2]))
		var v string
		var ok bool
		switch abi.MapType(s[0]) {
		case abi.MapRequestHeaders:
			v, ok = h.headers[h.current][string(key)]
		case abi.MapCallResponseHeaders:
			v, ok = h.answer.headers[string(key)]
		case abi.MapCallResponseTrailers:
			v, ok = h.answer.trailers[string(key)]
		case abi.MapResponseHeaders:
			v, ok = h.respHeaders[h.current][string(key)]
		case abi.MapResponseTrailers:
			v, ok = h.respTrailers[h.current][string(key)]
		}
		if !ok {
			s[0] = uint64(abi.StatusNotFound)
			return
		}
		s[0] = h.giveString(m, v, uint32(s[3]), uint32(s[4]))
	})
	export("proxy_add_header_map_value", []api.ValueType{i32, i32, i32, i32, i32}, func(_ context.Context, m api.Module, s []uint64) {
		s[0] = 0
	})
	export("proxy_get_property", []api.ValueType{i32, i32, i32, i32}, func(_ context.Context, m api.Module, s []uint64) {
		path, _ := m.Memory().Read(uint32(s[0]), uint32(s[1]))
		if v, ok := h.props[h.current][string(path)]; ok {
			s[0] = h.give(m, v, uint32(s[2]), uint32(s[3]))
			return
		}
		if string(path) != "source\x00address" {
			s[0] = uint64(abi.StatusNotFound)
			return
		}
		s[0] = h.giveString(m, h.remote, uint32(s[2]), uint32(s[3]))
	})
	export("proxy_continue_stream", []api.ValueType{i32}, func(_ context.Context, m api.Module, s []uint64) {
		h.resumed[h.current]++
		s[0] = 0
	})
	export("proxy_send_local_response", []api.ValueType{i32, i32, i32, i32, i32, i32, i32, i32}, func(_ context.Context, m api.Module, s []uint64) {
		h.nLocals++
		if !h.quiet {
			h.locals[h.current] = uint32(s[0])
			hs, _ := m.Memory().Read(uint32(s[5]), uint32(s[6]))
			h.lastBody = append(h.lastBody[:0], hs...)
		}
		s[0] = 0
	})
	export("proxy_http_call", []api.ValueType{i32, i32, i32, i32, i32, i32, i32, i32, i32, i32}, func(_ context.Context, m api.Module, s []uint64) {
		h.calls = append(h.calls, h.current)
		if !h.quiet {
			hs, _ := m.Memory().Read(uint32(s[2]), uint32(s[3]))
			body, _ := m.Memory().Read(uint32(s[4]), uint32(s[5]))
			h.callHeaders = append(h.callHeaders, append([]byte(nil), hs...))
			h.callBodies = append(h.callBodies, append([]byte(nil), body...))
		}
		m.Memory().WriteUint32Le(uint32(s[9]), uint32(len(h.calls)))
		s[0] = 0
	})
	export("proxy_set_effective_context", []api.ValueType{i32}, func(_ context.Context, m api.Module, s []uint64) {
		h.current = uint32(s[0])
		s[0] = 0
	})
	export("proxy_set_tick_period_milliseconds", []api.ValueType{i32}, func(_ context.Context, m api.Module, s []uint64) {
		s[0] = 0
	})
	export("proxy_define_metric", []api.ValueType{i32, i32, i32, i32}, func(_ context.Context, m api.Module, s []uint64) {
		m.Memory().WriteUint32Le(uint32(s[3]), 1)
		s[0] = 0
	})
	h.exportSharedData(export)
	h.exportGRPC(export)
	export("proxy_increment_metric", []api.ValueType{i32, i64}, func(_ context.Context, m api.Module, s []uint64) {
		s[0] = 0
	})
	if _, err := b.Instantiate(h.ctx); err != nil {
		tb.Fatal(err)
	}
	cfg := wazero.NewModuleConfig().WithSysNanotime().WithSysWalltime().WithStartFunctions("_initialize")
	if now, ok := ctx.Value(clockKey{}).(*int64); ok {
		cfg = cfg.WithNanotime(func() int64 { return *now }, 1)
	}
	mod, err := h.runtime.InstantiateWithConfig(h.ctx, wasm, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	h.mod = mod
	for name := range mod.ExportedFunctionDefinitions() {
		h.fn[name] = mod.ExportedFunction(name)
	}
	h.malloc = h.fn["proxy_on_memory_allocate"]
	h.call("proxy_on_context_create", 1, 0)
	if h.call("proxy_on_vm_start", 1, 0) != 1 {
		tb.Fatal("vm start failed")
	}
	return h
}

// give copies data into guest memory from proxy_on_memory_allocate and
// writes its address and size to the out-parameters.
func (h *wasmHost) give(m api.Module, data []byte, ptrOut, sizeOut uint32) uint64 {
	ptr := h.allocate(len(data))
	m.Memory().Write(ptr, data)
	m.Memory().WriteUint32Le(ptrOut, ptr)
	m.Memory().WriteUint32Le(sizeOut, uint32(len(data)))
	return 0
}

func (h *wasmHost) giveString(m api.Module, s string, ptrOut, sizeOut uint32) uint64 {
	ptr := h.allocate(len(s))
	m.Memory().WriteString(ptr, s)
	m.Memory().WriteUint32Le(ptrOut, ptr)
	m.Memory().WriteUint32Le(sizeOut, uint32(len(s)))
	return 0
}

// allocate asks the guest for n bytes (proxy_on_memory_allocate), without
// allocating in the host.
func (h *wasmHost) allocate(n int) uint32 {
	h.mstack[0] = uint64(n)
	if err := h.malloc.CallWithStack(h.ctx, h.mstack); err != nil {
		h.tb.Fatal(err)
	}
	return uint32(h.mstack[0])
}

// call calls an export with up to a few i32 arguments, without allocating.
func (h *wasmHost) call(name string, args ...uint64) uint64 {
	f, ok := h.fn[name]
	if !ok {
		h.tb.Fatalf("no export %s", name)
	}
	copy(h.stack, args)
	if err := f.CallWithStack(h.ctx, h.stack); err != nil {
		h.tb.Fatalf("%s: %v", name, err)
	}
	return h.stack[0]
}

func (h *wasmHost) configure() bool {
	h.current = 1
	return h.call("proxy_on_configure", 1, uint64(len(h.config))) == 1
}

func (h *wasmHost) request(id uint32, headers map[string]string) uint64 {
	h.headers[id] = headers
	h.current = id
	h.call("proxy_on_context_create", uint64(id), 1)
	return h.call("proxy_on_request_headers", uint64(id), uint64(len(headers)), 1)
}

func (h *wasmHost) finish(id uint32) {
	h.current = id
	h.call("proxy_on_done", uint64(id))
	h.call("proxy_on_delete", uint64(id))
	delete(h.headers, id)
}

func (h *wasmHost) deliver(callID uint32, a *hostAnswer) {
	h.answer = a
	h.current = 1
	if a == nil {
		h.call("proxy_on_http_call_response", 1, uint64(callID), 0, 0, 0)
		return
	}
	h.call("proxy_on_http_call_response", 1, uint64(callID), uint64(len(a.headers)), uint64(len(a.body)), uint64(len(a.trailers)))
	h.answer = nil
}

func hostOverLimit(tb testing.TB, retryAfterMs float64) *hostAnswer {
	return overLimitAnswer(tb, []time.Duration{time.Minute, time.Second}, []any{
		map[string]any{"algorithm": "sliding_window", "limit": 100, "window_ms": 60000, "retry_after_ms": retryAfterMs},
		map[string]any{"algorithm": "token_bucket", "limit": 10, "window_ms": 1000, "burst": 10, "retry_after_ms": retryAfterMs},
	})
}

// overLimitAnswer is the control plane's OVER_LIMIT answer for descriptors
// whose statuses reset after resets, with the sluice metadata limits.
func overLimitAnswer(tb testing.TB, resets []time.Duration, limits []any) *hostAnswer {
	meta, err := structpb.NewStruct(map[string]any{rlsproto.MetadataKey: limits})
	if err != nil {
		tb.Fatal(err)
	}
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT, DynamicMetadata: meta}
	for _, d := range resets {
		resp.Statuses = append(resp.Statuses, &rlsv3.RateLimitResponse_DescriptorStatus{
			Code: rlsv3.RateLimitResponse_OVER_LIMIT, DurationUntilReset: durationpb.New(d),
		})
	}
	return &hostAnswer{
		headers:  map[string]string{":status": "200"},
		trailers: map[string]string{"grpc-status": "0"},
		body:     grpcAnswer(tb, resp),
	}
}

const benchConfig = `{
  "cluster": "sluice_cp",
  "domain": "edge",
  "rate_limits": [
    {"actions": [{"remote_address": {}}]},
    {"actions": [{"request_headers": {"header_name": "x-api-key", "descriptor_key": "api_key"}}, {"method": {}}]}
  ]
}`

var benchRequest = map[string]string{":method": "GET", ":path": "/v1/items", ":authority": "example.com", "x-api-key": "key-1"}

// overLimitHost returns a host whose filter has learnt that benchRequest's
// descriptors are over their limit for an hour.
func overLimitHost(tb testing.TB, wasm []byte) *wasmHost {
	h := newWasmHost(tb, wasm, benchConfig)
	if !h.configure() {
		tb.Fatalf("configuration refused: %v", h.logs)
	}
	if a := h.request(2, benchRequest); a != uint64(abi.ActionPause) || len(h.calls) != 1 {
		tb.Fatalf("action %d, %d calls", a, len(h.calls))
	}
	h.deliver(1, hostOverLimit(tb, 3600e3))
	if h.locals[2] != 429 {
		tb.Fatalf("no 429 for the over-limit answer: %v", h.logs)
	}
	h.finish(2)
	if a := h.request(3, benchRequest); a != uint64(abi.ActionPause) || len(h.calls) != 1 || h.locals[3] != 429 {
		tb.Fatalf("the precheck did not reject: action %d, calls %d", a, len(h.calls))
	}
	h.finish(3)
	return h
}

// hostAdmitted returns an OK answer whose descriptors have a token bucket
// of one request per hour, burst 1.
func hostAdmitted(tb testing.TB) *hostAnswer {
	limit := map[string]any{"algorithm": "token_bucket", "limit": 1, "window_ms": 3600e3, "burst": 1}
	meta, err := structpb.NewStruct(map[string]any{rlsproto.MetadataKey: []any{limit, limit}})
	if err != nil {
		tb.Fatal(err)
	}
	return &hostAnswer{
		headers:  map[string]string{":status": "200"},
		trailers: map[string]string{"grpc-status": "0"},
		body: grpcAnswer(tb, &rlsv3.RateLimitResponse{
			OverallCode:     rlsv3.RateLimitResponse_OK,
			Statuses:        []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: 1}, {Code: 1}},
			DynamicMetadata: meta,
		}),
	}
}

// emptyBucketHost returns a host whose filter's local token bucket for
// benchRequest's descriptors is empty: the control plane admitted requests
// until the bucket (burst 1, plus the slack for the call latency) had no
// room left, and it refills one request per hour.
func emptyBucketHost(tb testing.TB, wasm []byte) *wasmHost {
	h := newWasmHost(tb, wasm, benchConfig)
	if !h.configure() {
		tb.Fatalf("configuration refused: %v", h.logs)
	}
	for id := uint32(2); ; id++ {
		calls := len(h.calls)
		h.request(id, benchRequest)
		if len(h.calls) == calls {
			if h.locals[id] != 429 {
				tb.Fatalf("request %d neither called out nor rejected", id)
			}
			h.finish(id)
			return h
		}
		if id > 10 {
			tb.Fatal("the local bucket never ran out")
		}
		h.deliver(uint32(len(h.calls)), hostAdmitted(tb))
		h.finish(id)
	}
}

func TestWasmScenarios(t *testing.T) {
	h := newWasmHost(t, filterWasm, benchConfig)
	if !h.configure() {
		t.Fatalf("configuration refused: %v", h.logs)
	}
	// Allowed.
	h.request(10, benchRequest)
	h.deliver(1, &hostAnswer{
		headers: map[string]string{":status": "200"}, trailers: map[string]string{"grpc-status": "0"},
		body: grpcAnswer(t, &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
			Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: 1}, {Code: 1}}}),
	})
	if h.resumed[10] != 1 {
		t.Fatalf("allowed request not resumed: %v", h.logs)
	}
	h.finish(10)
	// Timeout: fail open.
	h.request(11, benchRequest)
	h.deliver(2, nil)
	if h.resumed[11] != 1 || !strings.Contains(strings.Join(h.logs, "\n"), "failing open") {
		t.Fatalf("timeout not failed open: %v", h.logs)
	}
	h.finish(11)
	// Over limit, then rejected by the precheck without a call.
	h.request(12, benchRequest)
	h.deliver(3, hostOverLimit(t, 60e3))
	if h.locals[12] != 429 {
		t.Fatal("no 429")
	}
	pairs, err := headermap.Parse(nil, h.lastBody)
	if err != nil || findHeader(pairs, "retry-after") != "60" || findHeader(pairs, "ratelimit") == "" {
		t.Fatalf("429 headers %v (%v)", pairs, err)
	}
	h.finish(12)
	h.request(13, benchRequest)
	if h.locals[13] != 429 || len(h.calls) != 3 {
		t.Fatalf("precheck: local %d, calls %d", h.locals[13], len(h.calls))
	}
	// A bad configuration is refused.
	bad := newWasmHost(t, filterWasm, `{"cluster":"cp"}`)
	if bad.configure() || !strings.Contains(strings.Join(bad.logs, "\n"), "domain: is required") {
		t.Fatalf("bad configuration: %v", bad.logs)
	}
}

// TestWasmPanicAppliesFailureMode makes proxy_on_request_headers panic in
// filter.wasm (the sluicetest build's peer address panics on demand): the
// panic is recovered and logged, the failure mode applies, and the module
// keeps working.
func TestWasmPanicAppliesFailureMode(t *testing.T) {
	for _, mode := range []string{"open", "closed"} {
		config := strings.Replace(benchConfig, `"domain"`, `"failure_mode": "`+mode+`", "domain"`, 1)
		h := newWasmHost(t, filterWasmDev, config)
		if !h.configure() {
			t.Fatalf("configuration refused: %v", h.logs)
		}
		h.call("sluice_test_panic", 1)
		action := h.request(2, benchRequest)
		if !strings.Contains(strings.Join(h.logs, "\n"), "panic in request headers: injected failure") {
			t.Fatalf("%s: panic not logged: %v", mode, h.logs)
		}
		if mode == "open" && (action != uint64(abi.ActionContinue) || len(h.locals) != 0) {
			t.Fatalf("open: action %d, local replies %v", action, h.locals)
		}
		if mode == "closed" && (action != uint64(abi.ActionPause) || h.locals[2] != 500) {
			t.Fatalf("closed: action %d, local replies %v", action, h.locals)
		}
		h.finish(2)
		h.call("sluice_test_panic", 0)
		if action := h.request(3, benchRequest); action != uint64(abi.ActionPause) || len(h.calls) != 1 {
			t.Fatalf("%s: module broken after a panic: action %d, %d calls", mode, action, len(h.calls))
		}
	}
}

// TestWasmPrecheckRejectionAllocatesNothing counts the guest's own heap
// allocations (runtime.MemStats.Mallocs, exported by the sluicetest build)
// over many requests the precheck rejects.
func TestWasmPrecheckRejectionAllocatesNothing(t *testing.T) {
	for name, newHost := range map[string]func(testing.TB, []byte) *wasmHost{
		"over limit":   overLimitHost,
		"empty bucket": emptyBucketHost,
	} {
		t.Run(name, func(t *testing.T) {
			h := newHost(t, filterWasmDev)
			h.quiet = true
			run := func(n int) {
				for i := 0; i < n; i++ {
					id := uint32(100 + i%2)
					h.current = id
					h.call("proxy_on_context_create", uint64(id), 1)
					h.call("proxy_on_request_headers", uint64(id), 4, 1)
					h.call("proxy_on_done", uint64(id))
					h.call("proxy_on_delete", uint64(id))
				}
			}
			h.headers[100], h.headers[101] = benchRequest, benchRequest
			run(100) // warm up: tables and buffers reach their size
			before := h.call("sluice_test_mallocs")
			locals := h.nLocals
			run(1000)
			after := h.call("sluice_test_mallocs")
			if h.nLocals-locals != 1000 {
				t.Fatalf("%d local responses for 1000 requests", h.nLocals-locals)
			}
			if after != before {
				t.Fatalf("the guest allocated %d times in 1000 rejected requests", after-before)
			}
		})
	}
}
