package main

import (
	"encoding/binary"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluicehq/sluice/filter/core/rlsproto"
)

// The conformance test runs filter.wasm under github.com/tetratelabs/
// proxy-wasm-go-sdk's proxytest emulator, an independent implementation of
// the host side of the ABI. proxytest instantiates the module without
// calling _initialize, so the test adds a start section that calls it.

const conformanceConfig = `{
  "cluster": "sluice_cp",
  "domain": "edge",
  "timeout": "30ms",
  "rate_limits": [
    {"actions": [{"remote_address": {}}]},
    {"actions": [{"request_headers": {"header_name": "x-api-key", "descriptor_key": "api_key"}}]}
  ]
}`

// proxytestWasm returns filter.wasm built with the sluice_nogrpc tag:
// proxytest implements no proxy_grpc_call or proxy_get_status (ABI 0.2.1
// has them, and Envoy implements them), and refuses a module that imports
// them. The build is the production one otherwise.
func proxytestWasm(t *testing.T) []byte {
	t.Helper()
	proxytestOnce.Do(func() {
		proxytestModule, proxytestErr = buildWasm(wasmDir, "filter-nogrpc.wasm", "-tags", "sluice_nogrpc")
	})
	if proxytestErr != nil {
		t.Fatal(proxytestErr)
	}
	return proxytestModule
}

var (
	proxytestOnce   sync.Once
	proxytestModule []byte
	proxytestErr    error
)

func newEmulator(t *testing.T, config string) (proxytest.HostEmulator, func()) {
	t.Helper()
	wasm, err := withStartInitialize(proxytestWasm(t))
	if err != nil {
		t.Fatal(err)
	}
	vm, err := proxytest.NewWasmVMContext(wasm)
	if err != nil {
		t.Fatal(err)
	}
	opt := proxytest.NewEmulatorOption().
		WithVMContext(vm).
		WithPluginConfiguration([]byte(config)).
		WithProperty([]string{"source", "address"}, []byte("192.0.2.7:41000"))
	host, reset := proxytest.NewHostEmulator(opt)
	return host, func() {
		reset()
		_ = vm.Close()
	}
}

// grpcAnswer frames a RateLimitResponse as a gRPC response body.
func grpcAnswer(tb testing.TB, resp *rlsv3.RateLimitResponse) []byte {
	tb.Helper()
	msg, err := proto.Marshal(resp)
	if err != nil {
		tb.Fatal(err)
	}
	body := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(msg)))
	return append(body, msg...)
}

func findHeader(hs [][2]string, name string) string {
	for _, h := range hs {
		if h[0] == name {
			return h[1]
		}
	}
	return ""
}

var grpcOKHeaders = [][2]string{{":status", "200"}, {"content-type", "application/grpc"}}
var grpcOKTrailers = [][2]string{{"grpc-status", "0"}}

func TestConformanceProxytest(t *testing.T) {
	host, done := newEmulator(t, conformanceConfig)
	defer done()
	if status := host.StartPlugin(); status != types.OnPluginStartStatusOK {
		t.Fatalf("configuration refused: %v", host.GetErrorLogs())
	}
	if host.GetTickPeriod() != 1000 {
		t.Fatalf("tick period %d", host.GetTickPeriod())
	}

	// An allowed request: one call to the control plane, then resumed, then
	// the response carries the rate limit headers.
	id := host.InitializeHttpContext()
	request := [][2]string{{":method", "GET"}, {":path", "/a"}, {":authority", "example.com"}, {"x-api-key", "key-1"}}
	if action := host.CallOnRequestHeaders(id, request, false); action != types.ActionPause {
		t.Fatalf("action %v, want pause while the control plane is asked", action)
	}
	callouts := host.GetCalloutAttributesFromContext(id)
	if len(callouts) != 1 {
		t.Fatalf("%d callouts", len(callouts))
	}
	c := callouts[0]
	if c.Upstream != "sluice_cp" || findHeader(c.Headers, ":path") != rlsproto.ShouldRateLimitPath ||
		findHeader(c.Headers, ":authority") != "sluice_cp" || findHeader(c.Headers, "content-type") != "application/grpc" ||
		findHeader(c.Headers, "te") != "trailers" || findHeader(c.Headers, "grpc-timeout") != "30m" || len(c.Trailers) != 0 {
		t.Fatalf("callout %+v", c)
	}
	msg, err := rlsproto.ParseFrame(c.Body)
	if err != nil {
		t.Fatal(err)
	}
	var req rlsv3.RateLimitRequest
	if err := proto.Unmarshal(msg, &req); err != nil {
		t.Fatal(err)
	}
	if req.Domain != "edge" || len(req.Descriptors) != 2 ||
		req.Descriptors[0].Entries[0].Key != "remote_address" || req.Descriptors[0].Entries[0].Value != "192.0.2.7" ||
		req.Descriptors[1].Entries[0].Key != "api_key" || req.Descriptors[1].Entries[0].Value != "key-1" {
		t.Fatalf("request %v", &req)
	}
	meta, err := structpb.NewStruct(map[string]any{rlsproto.MetadataKey: []any{
		map[string]any{"algorithm": "gcra", "limit": 600, "window_ms": 60000, "burst": 10},
		map[string]any{"algorithm": "fixed_window", "limit": 5, "window_ms": 60000},
	}})
	if err != nil {
		t.Fatal(err)
	}
	host.CallOnHttpCallResponse(c.CalloutID, grpcOKHeaders, grpcOKTrailers, grpcAnswer(t, &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
			{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: 9, DurationUntilReset: durationpb.New(100 * time.Millisecond)},
			{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: 4, DurationUntilReset: durationpb.New(59 * time.Second)},
		},
		DynamicMetadata: meta,
	}))
	if action := host.GetCurrentHttpStreamAction(id); action != types.ActionContinue {
		t.Fatalf("request not resumed: %v", action)
	}
	if host.GetSentLocalResponse(id) != nil {
		t.Fatal("a local response for an allowed request")
	}
	host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
	rsp := host.GetCurrentResponseHeaders(id)
	if got, want := findHeader(rsp, "ratelimit-policy"), `"remote_address";q=600;w=60, "api_key";q=5;w=60`; got != want {
		t.Errorf("ratelimit-policy = %q, want %q", got, want)
	}
	if got, want := findHeader(rsp, "ratelimit"), `"remote_address";r=9;t=1, "api_key";r=4;t=59`; got != want {
		t.Errorf("ratelimit = %q, want %q", got, want)
	}
	host.CompleteHttpContext(id)

	// Over the limit: a local 429 with the headers.
	id2 := host.InitializeHttpContext()
	host.CallOnRequestHeaders(id2, request, false)
	c2 := host.GetCalloutAttributesFromContext(id2)
	if len(c2) != 1 {
		t.Fatalf("%d callouts", len(c2))
	}
	meta2, _ := structpb.NewStruct(map[string]any{rlsproto.MetadataKey: []any{
		map[string]any{"algorithm": "gcra", "limit": 600, "window_ms": 60000, "burst": 10},
		map[string]any{"algorithm": "fixed_window", "limit": 5, "window_ms": 60000, "retry_after_ms": 58000},
	}})
	host.CallOnHttpCallResponse(c2[0].CalloutID, grpcOKHeaders, grpcOKTrailers, grpcAnswer(t, &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
			{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: 8},
			{Code: rlsv3.RateLimitResponse_OVER_LIMIT, DurationUntilReset: durationpb.New(58 * time.Second)},
		},
		DynamicMetadata: meta2,
	}))
	local := host.GetSentLocalResponse(id2)
	if local == nil || local.StatusCode != 429 || local.StatusCodeDetail != "sluice_over_limit" || string(local.Data) != "rate limited\n" {
		t.Fatalf("local response %+v", local)
	}
	if findHeader(local.Headers, "retry-after") != "58" || findHeader(local.Headers, "ratelimit") != `"remote_address";r=8;t=0, "api_key";r=0;t=58` {
		t.Fatalf("429 headers %v", local.Headers)
	}
	host.CompleteHttpContext(id2)

	// The precheck now rejects the same key without a call.
	id3 := host.InitializeHttpContext()
	if action := host.CallOnRequestHeaders(id3, request, false); action != types.ActionPause {
		t.Fatalf("action %v", action)
	}
	if n := len(host.GetCalloutAttributesFromContext(id3)); n != 0 {
		t.Fatalf("%d callouts for a prechecked request", n)
	}
	local = host.GetSentLocalResponse(id3)
	if local == nil || local.StatusCode != 429 || local.StatusCodeDetail != "sluice_precheck_over_limit" {
		t.Fatalf("precheck local response %+v", local)
	}
	for name, want := range map[string]uint64{"sluice.allowed": 1, "sluice.over_limit": 1, "sluice.precheck_rejected": 1, "sluice.errors": 0} {
		if got, err := host.GetCounterMetric(name); err != nil || got != want {
			t.Errorf("counter %s = %d (%v), want %d", name, got, err, want)
		}
	}
}

func TestConformanceFailureModes(t *testing.T) {
	for _, mode := range []string{"open", "closed"} {
		t.Run(mode, func(t *testing.T) {
			host, done := newEmulator(t, strings.Replace(conformanceConfig, `"timeout"`, `"failure_mode":"`+mode+`","timeout"`, 1))
			defer done()
			if host.StartPlugin() != types.OnPluginStartStatusOK {
				t.Fatal("configuration refused")
			}
			id := host.InitializeHttpContext()
			host.CallOnRequestHeaders(id, [][2]string{{":method", "GET"}, {":path", "/"}}, false)
			c := host.GetCalloutAttributesFromContext(id)
			if len(c) != 1 {
				t.Fatalf("%d callouts", len(c))
			}
			// The control plane is unavailable: trailers-only gRPC error.
			host.CallOnHttpCallResponse(c[0].CalloutID, [][2]string{{":status", "200"}, {"grpc-status", "14"}, {"grpc-message", "no healthy upstream"}}, nil, nil)
			local := host.GetSentLocalResponse(id)
			if mode == "open" && (local != nil || host.GetCurrentHttpStreamAction(id) != types.ActionContinue) {
				t.Fatalf("failing open: local %+v, action %v", local, host.GetCurrentHttpStreamAction(id))
			}
			if mode == "closed" && (local == nil || local.StatusCode != 500) {
				t.Fatalf("failing closed: local %+v", local)
			}
			if n, _ := host.GetCounterMetric("sluice.errors"); n != 1 {
				t.Fatalf("errors counter %d", n)
			}
		})
	}
}

func TestConformanceBadConfigurationIsRefused(t *testing.T) {
	host, done := newEmulator(t, `{"cluster":"cp","domain":"d","rate_limits":[{"actions":[{"generic_key":{}}]}]}`)
	defer done()
	if host.StartPlugin() != types.OnPluginStartStatusFailed {
		t.Fatal("a bad configuration was accepted")
	}
	logs := strings.Join(host.GetErrorLogs(), "\n")
	if !strings.Contains(logs, "rate_limits[0].actions[0].generic_key.descriptor_value: is required") {
		t.Fatalf("error log does not name the field: %q", logs)
	}
}

// TestConformanceHold: an answer with a wait keeps the request paused and
// sets the tick to the release; the tick resumes it with the header saying
// how long it was held; a held request whose stream is deleted is dropped.
func TestConformanceHold(t *testing.T) {
	host, done := newEmulator(t, conformanceConfig)
	defer done()
	if status := host.StartPlugin(); status != types.OnPluginStartStatusOK {
		t.Fatalf("configuration refused: %v", host.GetErrorLogs())
	}
	request := [][2]string{{":method", "GET"}, {":path", "/a"}, {":authority", "example.com"}, {"x-api-key", "key-1"}}
	answer := func(id uint32, waitMs float64) {
		t.Helper()
		c := host.GetCalloutAttributesFromContext(id)
		if len(c) != 1 {
			t.Fatalf("%d callouts", len(c))
		}
		meta, err := structpb.NewStruct(map[string]any{rlsproto.MetadataKey: []any{
			map[string]any{},
			map[string]any{"algorithm": "reserve", "limit": 10, "window_ms": 1000, "burst": 5, "wait_ms": waitMs},
		}})
		if err != nil {
			t.Fatal(err)
		}
		host.CallOnHttpCallResponse(c[0].CalloutID, grpcOKHeaders, grpcOKTrailers, grpcAnswer(t, &rlsv3.RateLimitResponse{
			OverallCode: rlsv3.RateLimitResponse_OK,
			Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
				{Code: rlsv3.RateLimitResponse_OK}, {Code: rlsv3.RateLimitResponse_OK},
			},
			DynamicMetadata: meta,
		}))
	}
	gauge := func() uint64 {
		v, err := host.GetGaugeMetric("sluice.held")
		if err != nil {
			t.Fatal(err)
		}
		return v
	}

	// A wait of a microsecond: held until the next tick, which comes in 1 ms.
	id := host.InitializeHttpContext()
	host.CallOnRequestHeaders(id, request, false)
	answer(id, 0.001)
	if action := host.GetCurrentHttpStreamAction(id); action != types.ActionPause || gauge() != 1 || host.GetTickPeriod() != 1 {
		t.Fatalf("after the answer: action %v, held %d, tick %d", action, gauge(), host.GetTickPeriod())
	}
	host.Tick()
	if action := host.GetCurrentHttpStreamAction(id); action != types.ActionContinue || gauge() != 0 || host.GetTickPeriod() != 1000 {
		t.Fatalf("after the tick: action %v, held %d, tick %d", action, gauge(), host.GetTickPeriod())
	}
	if findHeader(host.GetCurrentRequestHeaders(id), "x-sluice-delayed-ms") == "" {
		t.Errorf("request headers %v", host.GetCurrentRequestHeaders(id))
	}
	host.CompleteHttpContext(id)

	// A wait of a minute, and the stream goes away.
	id2 := host.InitializeHttpContext()
	host.CallOnRequestHeaders(id2, request, false)
	answer(id2, 60000)
	if action := host.GetCurrentHttpStreamAction(id2); action != types.ActionPause || gauge() != 1 {
		t.Fatalf("action %v, held %d", action, gauge())
	}
	host.CompleteHttpContext(id2)
	host.Tick()
	for name, want := range map[string]uint64{"sluice.allowed": 2, "sluice.delayed": 1, "sluice.hold_abandoned": 1} {
		if got, err := host.GetCounterMetric(name); err != nil || got != want {
			t.Errorf("counter %s = %d (%v), want %d", name, got, err, want)
		}
	}
	if gauge() != 0 {
		t.Errorf("held %d after the stream went away", gauge())
	}
}
