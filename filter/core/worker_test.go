package core

import (
	"errors"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluicehq/sluice/filter/core/rlsproto"
)

const testConfig = `{
  "cluster": "sluice_cp",
  "authority": "cp.internal",
  "domain": "edge",
  "timeout": "25ms",
  "rate_limits": [
    {"actions": [{"remote_address": {}}]},
    {"actions": [{"request_headers": {"header_name": "x-api-key", "descriptor_key": "api_key"}}, {"path": {}}], "hits_addend": 2}
  ]
}`

func withFailureMode(mode string) string {
	return strings.Replace(testConfig, `"timeout"`, `"failure_mode": "`+mode+`", "timeout"`, 1)
}

var apiRequest = map[string]string{":method": "GET", ":path": "/v1/items?x=1", "x-api-key": "k1"}

func metadata(t testing.TB, elems ...map[string]any) *structpb.Struct {
	t.Helper()
	list := make([]any, len(elems))
	for i, e := range elems {
		list[i] = e
	}
	s, err := structpb.NewStruct(map[string]any{rlsproto.MetadataKey: list})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConfigureRefusesBadConfiguration(t *testing.T) {
	h := newFakeHost(t, `{"cluster":"c","domain":"d","rate_limits":[{"actions":[{"request_headers":{"descriptor_key":"k"}}]}]}`)
	w := NewWorker(h)
	if w.Configure(h.config) {
		t.Fatal("a bad configuration was accepted")
	}
	if !h.logged("error: sluice: invalid plugin configuration: config: rate_limits[0].actions[0].request_headers.header_name: is required") {
		t.Fatalf("the log does not name the field: %v", h.logs)
	}
	// An unconfigured instance lets requests through untouched.
	h.headers[5] = apiRequest
	if a := w.RequestHeaders(w.Open(&fakeStream{h: h, id: 5})); a != Continue || len(h.calls) != 0 {
		t.Fatalf("unconfigured plugin acted: action %d, calls %d", a, len(h.calls))
	}
}

func TestAllowedRequest(t *testing.T) {
	b := newTestbed(t, testConfig)
	if b.host.tick != tickPeriodMs {
		t.Fatalf("tick period %d", b.host.tick)
	}
	id, action := b.request(apiRequest, "10.0.0.9:4242")
	if action != Pause || len(b.host.calls) != 1 {
		t.Fatalf("action %d, %d calls; want a paused request and one call", action, len(b.host.calls))
	}
	c := b.host.calls[0]
	if c.cluster != "sluice_cp" || c.timeout != 25 || c.stream != id {
		t.Fatalf("call %+v", c)
	}
	for _, want := range [][2]string{
		{":method", "POST"}, {":path", rlsproto.ShouldRateLimitPath}, {":authority", "cp.internal"},
		{"content-type", "application/grpc"}, {"te", "trailers"}, {"grpc-timeout", "25m"},
	} {
		if v, ok := header(c.headers, want[0]); !ok || v != want[1] {
			t.Errorf("call header %s = %q, want %q", want[0], v, want[1])
		}
	}
	req := sentRequest(t, c.body)
	if req.Domain != "edge" || len(req.Descriptors) != 2 || req.HitsAddend != 1 ||
		req.Descriptors[0].Entries[0].Value != "10.0.0.9" ||
		req.Descriptors[1].Entries[0].Value != "k1" || req.Descriptors[1].Entries[1].Value != "/v1/items" ||
		req.Descriptors[1].HitsAddend.GetValue() != 2 {
		t.Fatalf("request %v", req)
	}

	b.deliver(grpcOK(t, &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
			{Code: rlsv3.RateLimitResponse_OK, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Name: "per-ip", RequestsPerUnit: 100, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE},
				LimitRemaining: 99, DurationUntilReset: durationpb.New(42 * time.Second)},
			{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: 7, DurationUntilReset: durationpb.New(500 * time.Millisecond)},
		},
		// The control plane's own copies of the rate limit headers (for
		// Envoy's ratelimit filter) are dropped: the filter sends its own.
		ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "x-from-rls", Value: "yes"},
			{Key: "RateLimit-Policy", Value: `"per-ip";q=100;w=60`}, {Key: "RateLimit", Value: `"per-ip";r=99;t=42`}},
		RequestHeadersToAdd: []*corev3.HeaderValue{{Key: "x-ratelimit-checked", Value: "1"}},
		DynamicMetadata: metadata(t,
			map[string]any{"algorithm": "fixed_window", "limit": 100, "window_ms": 60000},
			map[string]any{"algorithm": "token_bucket", "limit": 10, "window_ms": 1000, "burst": 20, "name": "api_key#0"},
		),
	}))
	if b.host.resumed[id] != 1 || len(b.host.local) != 0 {
		t.Fatalf("resumed %d times, local responses %v", b.host.resumed[id], b.host.local)
	}
	if got := b.host.addedReq[id]; len(got) != 1 || got[0] != [2]string{"x-ratelimit-checked", "1"} {
		t.Fatalf("request headers added: %v", got)
	}
	b.respond(id)
	got := b.host.addedRsp[id]
	want := [][2]string{
		{"ratelimit-policy", `"per-ip";q=100;w=60, "api_key#0";q=10;w=1`},
		{"ratelimit", `"per-ip";r=99;t=42, "api_key#0";r=7;t=1`},
		{"x-from-rls", "yes"},
	}
	if len(got) != len(want) {
		t.Fatalf("response headers %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("response header %d = %v, want %v", i, got[i], want[i])
		}
	}
	if b.host.counters[MetricAllowed] != 1 || b.host.counters[MetricErrors] != 0 {
		t.Fatalf("counters %v", b.host.counters)
	}
}

func overLimitAnswer(t testing.TB, retryAfterMs float64) *fakeAnswer {
	return grpcOK(t, &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
			{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: 50, DurationUntilReset: durationpb.New(10 * time.Second)},
			{Code: rlsv3.RateLimitResponse_OVER_LIMIT, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Name: "per-key"},
				DurationUntilReset: durationpb.New(60 * time.Second)},
		},
		ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "x-from-rls", Value: "denied"}},
		DynamicMetadata: metadata(t,
			map[string]any{"algorithm": "sliding_log", "limit": 100, "window_ms": 60000},
			map[string]any{"algorithm": "gcra", "limit": 10, "window_ms": 60000, "burst": 4, "retry_after_ms": retryAfterMs},
		),
	})
}

func TestOverLimitThenPrecheck(t *testing.T) {
	b := newTestbed(t, testConfig)
	id, _ := b.request(apiRequest, "10.0.0.9:4242")
	b.deliver(overLimitAnswer(t, 6000))
	l, ok := b.host.local[id]
	if !ok || l.status != 429 || l.details != DetailsOverLimit || l.body != "rate limited\n" {
		t.Fatalf("local response %+v", l)
	}
	for _, want := range [][2]string{
		{"ratelimit-policy", `"remote_address";q=100;w=60, "per-key";q=10;w=60`},
		{"ratelimit", `"remote_address";r=50;t=10, "per-key";r=0;t=60`},
		{"retry-after", "6"},
		{"x-from-rls", "denied"},
	} {
		if v, _ := header(l.headers, want[0]); v != want[1] {
			t.Errorf("%s = %q, want %q", want[0], v, want[1])
		}
	}
	if b.host.resumed[id] != 0 || b.host.counters[MetricOverLimit] != 1 {
		t.Fatalf("resumed %d, counters %v", b.host.resumed[id], b.host.counters)
	}
	b.respond(id)
	if len(b.host.addedRsp[id]) != 0 {
		t.Fatal("headers added to the local reply's response path")
	}

	// The same descriptor is now rejected locally, without a call, until
	// retry-after minus the call timeout.
	b.host.now += int64(3 * time.Second)
	id2, action := b.request(apiRequest, "10.0.0.10:1")
	if action != Pause || len(b.host.calls) != 1 {
		t.Fatalf("precheck did not reject: action %d, calls %d", action, len(b.host.calls))
	}
	l = b.host.local[id2]
	if l.status != 429 || l.details != DetailsPrecheck {
		t.Fatalf("local response %+v", l)
	}
	// Blocked until sentAt + 6s - 25ms - 1us, but the client is told the
	// answer's arrival + 6s: 3s from now. The limit has the control
	// plane's name, as in its own 429.
	for _, want := range [][2]string{
		{"ratelimit-policy", `"per-key";q=10;w=60`},
		{"ratelimit", `"per-key";r=0;t=3`},
		{"retry-after", "3"},
	} {
		if v, _ := header(l.headers, want[0]); v != want[1] {
			t.Errorf("%s = %q, want %q", want[0], v, want[1])
		}
	}
	if b.host.counters[MetricPrecheckRejected] != 1 {
		t.Fatalf("counters %v", b.host.counters)
	}
	// The reply's headers are cached per second of retry-after: the same
	// within the second, fresh after it.
	b.host.now += int64(500 * time.Millisecond)
	id3, _ := b.request(apiRequest, "10.0.0.10:1")
	if v, _ := header(b.host.local[id3].headers, "retry-after"); v != "3" {
		t.Fatalf("retry-after %q within the same second", v)
	}
	b.host.now += int64(time.Second)
	id4, _ := b.request(apiRequest, "10.0.0.10:1")
	if v, _ := header(b.host.local[id4].headers, "retry-after"); v != "2" {
		t.Fatalf("retry-after %q a second later, want 2", v)
	}
	if v, _ := header(b.host.local[id4].headers, "ratelimit"); v != `"per-key";r=0;t=2` {
		t.Fatalf("ratelimit %q a second later", v)
	}
	// Another key is not blocked.
	other := map[string]string{":method": "GET", ":path": "/v1/items", "x-api-key": "k2"}
	if _, action := b.request(other, "10.0.0.10:1"); action != Pause || len(b.host.calls) != 2 {
		t.Fatalf("another key was blocked")
	}
	// After the block, the control plane is asked again.
	b.host.now += int64(3 * time.Second)
	if _, action := b.request(apiRequest, "10.0.0.10:1"); action != Pause || len(b.host.calls) != 3 {
		t.Fatalf("still blocked after retry-after: calls %d", len(b.host.calls))
	}
}

func TestPlainRLSFallback(t *testing.T) {
	// Without sluice metadata: current_limit is a fixed window and
	// duration_until_reset the retry-after.
	b := newTestbed(t, `{"cluster":"cp","domain":"d","headers":{"legacy":true,"draft10":false},"rate_limits":[{"actions":[{"generic_key":{"descriptor_value":"all"}}]}]}`)
	id, _ := b.request(apiRequest, "")
	b.deliver(grpcOK(t, &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{
			Code:               rlsv3.RateLimitResponse_OVER_LIMIT,
			CurrentLimit:       &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 5, Unit: rlsv3.RateLimitResponse_RateLimit_HOUR},
			DurationUntilReset: durationpb.New(30 * time.Minute),
		}},
	}))
	l := b.host.local[id]
	for _, want := range [][2]string{
		{"x-ratelimit-limit", "5"}, {"x-ratelimit-remaining", "0"}, {"x-ratelimit-reset", "1800"}, {"retry-after", "1800"},
	} {
		if v, _ := header(l.headers, want[0]); v != want[1] {
			t.Errorf("%s = %q, want %q", want[0], v, want[1])
		}
	}
	if _, ok := header(l.headers, "ratelimit"); ok {
		t.Error("draft-10 headers sent although disabled")
	}
	b.host.now += int64(29 * time.Minute)
	id2, _ := b.request(apiRequest, "")
	if b.host.local[id2].details != DetailsPrecheck || len(b.host.calls) != 1 {
		t.Fatalf("fallback retry-after not used by the precheck: %+v", b.host.local[id2])
	}
}

func TestFailureModes(t *testing.T) {
	okBody := grpcOK(t, &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}).body
	tests := []struct {
		name    string
		callErr error
		answer  *fakeAnswer // nil: the call failed (no headers)
	}{
		{name: "call refused", callErr: errors.New("BAD_ARGUMENT")},
		{name: "timeout"},
		{name: "http 503", answer: &fakeAnswer{headers: map[string]string{":status": "503"}, trailers: map[string]string{}}},
		{name: "envoy timeout", answer: &fakeAnswer{headers: map[string]string{":status": "200"}, trailers: map[string]string{"grpc-status": "14", "grpc-message": "upstream request timeout"}}},
		{name: "grpc error in trailers", answer: &fakeAnswer{headers: map[string]string{":status": "200"}, trailers: map[string]string{"grpc-status": "14", "grpc-message": "unavailable"}}},
		{name: "trailers-only grpc error", answer: &fakeAnswer{headers: map[string]string{":status": "200", "grpc-status": "7"}, trailers: map[string]string{}}},
		{name: "no grpc status", answer: &fakeAnswer{headers: map[string]string{":status": "200"}, trailers: map[string]string{}, body: okBody}},
		{name: "bad frame", answer: &fakeAnswer{headers: map[string]string{":status": "200"}, trailers: map[string]string{"grpc-status": "0"}, body: []byte{0, 0, 0, 0, 9, 1}}},
		{name: "bad message", answer: &fakeAnswer{headers: map[string]string{":status": "200"}, trailers: map[string]string{"grpc-status": "0"}, body: []byte{0, 0, 0, 0, 2, 0x08, 0x80}}},
		{name: "unknown overall code", answer: grpcOK(t, &rlsv3.RateLimitResponse{})},
	}
	for _, mode := range []string{"open", "closed"} {
		for _, tt := range tests {
			t.Run(mode+"/"+tt.name, func(t *testing.T) {
				b := newTestbed(t, withFailureMode(mode))
				b.host.callErr = tt.callErr
				id, action := b.request(apiRequest, "10.0.0.1:1")
				if tt.callErr == nil {
					if action != Pause {
						t.Fatalf("action %d", action)
					}
					b.deliver(tt.answer)
				}
				if b.host.counters[MetricErrors] != 1 || !b.host.logged("warn: sluice: rate limit check failed, failing "+mode) {
					t.Fatalf("failure not counted or logged: %v %v", b.host.counters, b.host.logs)
				}
				timedOut := tt.name == "timeout" || tt.name == "envoy timeout"
				if b.host.logged("raise the plugin's timeout (now 25ms)") != timedOut {
					t.Errorf("timed out %v, but the warning's hint to raise the timeout is there: %v (%v)", timedOut, !timedOut, b.host.logs)
				}
				l, replied := b.host.local[id]
				if mode == "open" {
					if replied || b.host.counters[MetricFailureOpen] != 1 {
						t.Fatalf("failing open replied %+v, counters %v", l, b.host.counters)
					}
					if tt.callErr != nil && action != Continue {
						t.Fatalf("action %d, want continue", action)
					}
					if tt.callErr == nil && b.host.resumed[id] != 1 {
						t.Fatalf("request resumed %d times", b.host.resumed[id])
					}
					return
				}
				if !replied || l.status != 500 || l.details != DetailsFailure || b.host.counters[MetricFailureClosed] != 1 || b.host.resumed[id] != 0 {
					t.Fatalf("failing closed: reply %+v, resumed %d, counters %v", l, b.host.resumed[id], b.host.counters)
				}
				if tt.callErr != nil && action != Pause {
					t.Fatalf("action %d, want pause", action)
				}
			})
		}
	}
}

func TestWarningsAreRateLimited(t *testing.T) {
	b := newTestbed(t, testConfig)
	b.host.callErr = errors.New("INTERNAL_FAILURE")
	for i := 0; i < 5; i++ {
		b.request(apiRequest, "")
	}
	b.host.now += int64(time.Second)
	b.request(apiRequest, "")
	warns := 0
	for _, l := range b.host.logs {
		if strings.HasPrefix(l, "warn:") {
			warns++
		}
	}
	if warns != 2 || !b.host.logged("(4 similar messages suppressed)") || b.host.counters[MetricErrors] != 6 {
		t.Fatalf("%d warnings: %v", warns, b.host.logs)
	}
}

func TestStreamDeletedBeforeAnswer(t *testing.T) {
	b := newTestbed(t, testConfig)
	id, _ := b.request(apiRequest, "10.0.0.9:1")
	b.close(id)
	delete(b.host.headers, id) // the proxy no longer knows the context
	b.deliver(overLimitAnswer(t, 60000))
	if len(b.host.local) != 0 || b.host.resumed[id] != 0 {
		t.Fatal("acted on a deleted stream")
	}
	// The stream was recycled.
	if len(b.w.exchanges.free) != 1 {
		t.Fatalf("%d streams released, want 1", len(b.w.exchanges.free))
	}
	// The answer still taught the precheck.
	id2, _ := b.request(apiRequest, "10.0.0.9:1")
	if b.host.local[id2].details != DetailsPrecheck {
		t.Fatalf("precheck not updated by the late answer: %+v", b.host.local[id2])
	}
}

func TestTickGivesUpOnUnansweredCalls(t *testing.T) {
	b := newTestbed(t, withFailureMode("closed"))
	id, _ := b.request(apiRequest, "10.0.0.9:1")
	b.runTick()
	if len(b.host.local) != 0 {
		t.Fatal("gave up before the timeout")
	}
	b.host.now += int64(25*time.Millisecond + time.Second + 1)
	b.runTick()
	if b.host.local[id].status != 500 || b.host.counters[MetricErrors] != 1 {
		t.Fatalf("overdue call not failed: %+v %v", b.host.local[id], b.host.counters)
	}
	// A late answer is ignored.
	b.deliver(overLimitAnswer(t, 1000))
	if b.host.counters[MetricOverLimit] != 0 {
		t.Fatal("a late answer was applied")
	}
}

func TestPanicAppliesFailureMode(t *testing.T) {
	for _, mode := range []string{"open", "closed"} {
		b := newTestbed(t, withFailureMode(mode))
		b.host.panicOnHeader = true
		id, action := b.request(apiRequest, "10.0.0.9:1")
		if !b.host.logged("critical: sluice: panic in request headers: injected failure") {
			t.Fatalf("%s: panic not logged: %v", mode, b.host.logs)
		}
		if mode == "open" && (action != Continue || len(b.host.local) != 0) {
			t.Fatalf("open: action %d, local %v", action, b.host.local)
		}
		if mode == "closed" && (action != Pause || b.host.local[id].status != 500) {
			t.Fatalf("closed: action %d, local %v", action, b.host.local)
		}
		// The VM keeps working.
		b.host.panicOnHeader = false
		if _, action := b.request(apiRequest, "10.0.0.9:1"); action != Pause {
			t.Fatalf("%s: VM broken after a panic", mode)
		}
	}
}

// TestPanicWhileAnswering: a panic while an answer is applied (here, in
// the per-Envoy state, as the denial is shared) applies the failure mode
// to its stream, at once.
func TestPanicWhileAnswering(t *testing.T) {
	for _, mode := range []string{"open", "closed"} {
		b := newTestbed(t, withFailureMode(mode))
		id, _ := b.request(apiRequest, "10.0.0.9:1")
		b.host.panicOnShared = true
		b.deliver(overLimitAnswer(t, 600000))
		if !b.host.logged("critical: sluice: panic in a call's answer: injected failure") || b.host.counters[MetricErrors] != 1 {
			t.Fatalf("%s: panic not handled: %v %v", mode, b.host.logs, b.host.counters)
		}
		if mode == "open" && (b.host.resumed[id] != 1 || len(b.host.local) != 0) {
			t.Fatalf("open: resumed %d, local %v", b.host.resumed[id], b.host.local)
		}
		if mode == "closed" && (b.host.resumed[id] != 0 || b.host.local[id].status != 500) {
			t.Fatalf("closed: resumed %d, local %v", b.host.resumed[id], b.host.local)
		}
		if b.w.calls.Len() != 0 {
			t.Fatal("the call is still pending")
		}
	}
}

func TestNoDescriptorsLetsThrough(t *testing.T) {
	b := newTestbed(t, `{"cluster":"cp","domain":"d","rate_limits":[{"actions":[{"request_headers":{"header_name":"x-user","descriptor_key":"user"}}]}]}`)
	if _, action := b.request(apiRequest, ""); action != Continue || len(b.host.calls) != 0 {
		t.Fatalf("action %d, calls %d", action, len(b.host.calls))
	}
}

func TestPrecheckDisabled(t *testing.T) {
	b := newTestbed(t, strings.Replace(testConfig, `"domain"`, `"precheck": false, "domain"`, 1))
	id, _ := b.request(apiRequest, "10.0.0.9:1")
	b.deliver(overLimitAnswer(t, 60000))
	if b.host.local[id].details != DetailsOverLimit {
		t.Fatal("no 429")
	}
	if _, action := b.request(apiRequest, "10.0.0.9:1"); action != Pause || len(b.host.calls) != 2 {
		t.Fatal("precheck acted although disabled")
	}
}

// rejectedStream teaches b's precheck that a request is over its limit and
// returns a function that runs a whole stream of that request, which the
// precheck rejects, quietly (recording nothing that allocates).
func (b *testbed) rejectedStream() func() {
	b.request(apiRequest, "10.0.0.9:1")
	b.deliver(overLimitAnswer(b.t, 600000))
	b.host.quiet = true
	id := uint32(5000)
	b.host.headers[id] = apiRequest
	b.host.remote[id] = "10.0.0.9:1"
	s := &fakeStream{h: b.host, id: id}
	return func() {
		x := b.w.Open(s)
		b.w.RequestHeaders(x)
		b.w.Close(x)
	}
}

// TestPrecheckRejectionAllocatesNothing checks the hot path the benchmark
// measures in Wasm: a request the precheck rejects.
func TestPrecheckRejectionAllocatesNothing(t *testing.T) {
	b := newTestbed(t, testConfig)
	reject := b.rejectedStream()
	before := b.host.locals
	allocs := testing.AllocsPerRun(200, reject)
	if b.host.locals-before < 200 {
		t.Fatalf("only %d local responses", b.host.locals-before)
	}
	if allocs != 0 {
		t.Fatalf("%v allocations per rejected request", allocs)
	}
}

// TestPrecheckStopsAtTheRejectingDescriptor checks that the descriptors are
// prechecked as they are built: once the first descriptor is known to be
// over its limit, a request is rejected without reading the headers the
// later descriptors need (reading them would panic here).
func TestPrecheckStopsAtTheRejectingDescriptor(t *testing.T) {
	b := newTestbed(t, testConfig)
	b.request(apiRequest, "10.0.0.9:1")
	b.deliver(grpcOK(t, &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
			{Code: rlsv3.RateLimitResponse_OVER_LIMIT},
			{Code: rlsv3.RateLimitResponse_OK},
		},
		DynamicMetadata: metadata(t,
			map[string]any{"algorithm": "fixed_window", "limit": 5, "window_ms": 60000, "retry_after_ms": 30000},
			map[string]any{"algorithm": "fixed_window", "limit": 100, "window_ms": 60000},
		),
	}))
	b.host.panicOnHeader = true
	id, action := b.request(apiRequest, "10.0.0.9:1")
	if action != Pause || b.host.local[id].details != DetailsPrecheck || len(b.host.calls) != 1 {
		t.Fatalf("action %d, local %+v, %d calls; logs %v", action, b.host.local[id], len(b.host.calls), b.host.logs)
	}
	// Another client still reaches the second descriptor (and its header).
	b.host.panicOnHeader = false
	if _, action := b.request(apiRequest, "10.0.0.10:1"); action != Pause || len(b.host.calls) != 2 {
		t.Fatalf("another client: action %d, %d calls", action, len(b.host.calls))
	}
}

// TestQuotaModeOverDoesNotBlock: in quota mode (envoyproxy/ratelimit's
// quota_mode) a descriptor can answer OVER_LIMIT in an answer that admits
// the request (not every quota descriptor is over); the precheck must not
// then reject that descriptor locally, since the control plane would admit
// the same request again.
func TestQuotaModeOverDoesNotBlock(t *testing.T) {
	b := newTestbed(t, testConfig)
	id, _ := b.request(apiRequest, "10.0.0.9:4242")
	b.deliver(grpcOK(t, &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
			{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: 50, DurationUntilReset: durationpb.New(10 * time.Second)},
			{Code: rlsv3.RateLimitResponse_OVER_LIMIT, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Name: "quota"},
				DurationUntilReset: durationpb.New(60 * time.Second)},
		},
		DynamicMetadata: metadata(t,
			map[string]any{"algorithm": "sliding_log", "limit": 100, "window_ms": 60000},
			map[string]any{"algorithm": "gcra", "limit": 10, "window_ms": 60000, "burst": 4, "retry_after_ms": 6000},
		),
	}))
	if b.host.resumed[id] != 1 {
		t.Fatalf("the admitted request was not resumed: %+v", b.host.local[id])
	}
	b.host.now += int64(time.Second)
	if _, action := b.request(apiRequest, "10.0.0.10:1"); action != Pause || len(b.host.calls) != 2 {
		t.Fatalf("the quota descriptor was blocked locally: calls %d", len(b.host.calls))
	}
}

// TestFailureModeHeader: with headers.failure_mode, a request the failure
// mode decided says so to its client; without it, nothing is added. A
// timeout's warning says which setting to raise.
func TestFailureModeHeader(t *testing.T) {
	for _, mode := range []string{"open", "closed"} {
		for _, on := range []bool{false, true} {
			cfg := withFailureMode(mode)
			if on {
				cfg = strings.Replace(cfg, `"timeout"`, `"headers": {"failure_mode": true}, "timeout"`, 1)
			}
			b := newTestbed(t, cfg)
			id, _ := b.request(apiRequest, "10.0.0.1:1")
			b.deliver(nil) // no answer: the call timed out
			if !b.host.logged("raise the plugin's timeout (now 25ms)") {
				t.Errorf("%s: the timeout's warning names no setting: %v", mode, b.host.logs)
			}
			var got []string
			if mode == "open" {
				b.respond(id)
				for _, h := range b.host.addedRsp[id] {
					if h[0] == HeaderFailureMode {
						got = append(got, h[1])
					}
				}
			} else {
				for _, h := range b.host.local[id].headers {
					if h[0] == HeaderFailureMode {
						got = append(got, h[1])
					}
				}
			}
			want := []string(nil)
			if on {
				want = []string{mode}
			}
			if strings.Join(got, ",") != strings.Join(want, ",") {
				t.Errorf("failure mode %s, header on %v: %s = %q, want %q", mode, on, HeaderFailureMode, got, want)
			}
		}
	}
}
