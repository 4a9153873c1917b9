package main

import (
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/filter/core/rlsproto"
	"github.com/sluicehq/sluice/filter/proxywasm/abi"
)

// llmWasmConfig reserves from the request body, reads the answer's usage
// and cuts a stream a slice of 20 tokens past what it was granted.
const llmWasmConfig = `{"cluster": "rls", "domain": "llm", "timeout": "100ms",
  "rate_limits": [{"actions": [{"request_headers": {"header_name": "x-api-key", "descriptor_key": "api_key"}}],
     "usage": {"reserve": 5, "reserve_from_request": true, "source": {"llm_usage": {}}, "cut": {"slice": 20}}}],
  "settle": {"batch_max": 1, "interval_ms": 0}, "llm": {"default_max_output": 0}}`

// llmChunk is one SSE event of a chat stream: "abcd" is one token.
const llmChunk = "data: {\"choices\":[{\"delta\":{\"content\":\"abcd\"}}]}\n\n"

// hostOK is the control plane's OK for one descriptor.
func hostOK(tb testing.TB) *hostAnswer {
	return &hostAnswer{headers: map[string]string{":status": "200"}, trailers: map[string]string{"grpc-status": "0"},
		body: grpcAnswer(tb, &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
			Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: 1}}})}
}

// hostRefused is the control plane's OVER_LIMIT for one descriptor.
func hostRefused(tb testing.TB) *hostAnswer {
	return &hostAnswer{headers: map[string]string{":status": "200"}, trailers: map[string]string{"grpc-status": "0"},
		body: grpcAnswer(tb, &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
			Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: 2, DurationUntilReset: durationpb.New(3600e9)}}})}
}

// callCost is the hits_addend of call i's descriptor.
func (h *wasmHost) callCost(i int) uint64 {
	msg, err := rlsproto.ParseFrame(h.callBodies[i])
	if err != nil {
		h.tb.Fatal(err)
	}
	var r rlsv3.RateLimitRequest
	if err := proto.Unmarshal(msg, &r); err != nil {
		h.tb.Fatal(err)
	}
	if v := r.Descriptors[0].GetHitsAddend(); v != nil {
		return v.Value
	}
	return uint64(r.HitsAddend)
}

// llmHost returns a host of filter.wasm (sluicetest) configured with cfg,
// and stream 2's request headers (a chat completions POST, noBody: ending
// with its headers) run, with their action.
func llmHost(t *testing.T, cfg string, noBody bool) (*wasmHost, uint64) {
	h := newWasmHost(t, filterWasmDev, cfg)
	if !h.configure() {
		t.Fatalf("configuration refused: %v", h.logs)
	}
	const id = 2
	req := map[string]string{":method": "POST", ":path": "/v1/chat/completions", "x-api-key": "k1"}
	h.headers[id], h.current = req, id
	h.call("proxy_on_context_create", id, 1)
	end := uint64(0)
	if noBody {
		end = 1
	}
	return h, h.call("proxy_on_request_headers", id, uint64(len(req)), end)
}

// TestWasmLLMStream runs an LLM stream through filter.wasm's bindings:
// the request waits (headers and body) until its body is read through
// proxy_on_request_body and proxy_get_buffer_bytes, the reserve is sized
// from it, the answer's chunks are read, a draw is refused, and the stream
// is cut: proxy_set_buffer_bytes gives the client what came before, then
// the cut event, and empties every later chunk. No chunk allocates.
func TestWasmLLMStream(t *testing.T) {
	h, a := llmHost(t, llmWasmConfig, false)
	const id = 2
	if a != uint64(abi.ActionPause) || len(h.calls) != 0 {
		t.Fatalf("request headers: action %d, %d calls; want a pause for the body", a, len(h.calls))
	}
	body := `{"model":"gpt-4o","messages":[{"role":"user","content":"` + strings.Repeat("q", 40) + `"}]}`
	h.reqBody[id] = []byte(body[:30])
	if a := h.call("proxy_on_request_body", id, 30, 0); a != uint64(abi.ActionPause) || len(h.calls) != 0 {
		t.Fatalf("first body chunk: action %d, %d calls", a, len(h.calls))
	}
	h.reqBody[id] = []byte(body)
	if a := h.call("proxy_on_request_body", id, uint64(len(body)), 1); a != uint64(abi.ActionPause) || len(h.calls) != 1 {
		t.Fatalf("last body chunk: action %d, %d calls; want the call", a, len(h.calls))
	}
	if c := h.callCost(0); c != 10 { // 40 bytes of prompt at 4 bytes a token, no output
		t.Fatalf("reserve %d, want 10", c)
	}
	h.deliver(1, hostOK(t))
	if h.resumed[id] != 1 {
		t.Fatalf("not resumed: %v", h.logs)
	}
	h.current = id
	h.respHeaders[id] = map[string]string{":status": "200", "content-type": "text/event-stream"}
	h.call("proxy_on_response_headers", id, 2, 0)
	var client strings.Builder
	chunk := func() {
		h.current = id
		h.respChunk[id] = []byte(llmChunk)
		h.call("proxy_on_response_body", id, uint64(len(llmChunk)), 0)
		client.Write(h.respChunk[id])
	}
	// Within the reserve and the first slice's credit; the draw asked for
	// when less than a slice is left is refused.
	for i := 0; i < 40 && len(h.calls) < 2; i++ {
		chunk()
	}
	if len(h.calls) != 2 || h.callCost(1) != 20 {
		t.Fatalf("%d calls: want a draw of one slice (20)", len(h.calls))
	}
	h.deliver(2, hostRefused(t))
	for range 40 {
		chunk()
	}
	got := client.String()
	events := strings.Count(got, "abcd")
	if events > 20 || !strings.Contains(got, `"code":"rate_limit_exceeded"`) || !strings.HasSuffix(got, "}}\n\n") {
		t.Fatalf("the client got %d events (granted 10 tokens, one slice of 20 past it: at most 20 of output): %q; logs %v; %d calls", events, got[max(0, len(got)-300):], h.logs, len(h.calls))
	}
	h.call("sluice_test_gc")
	before := h.call("sluice_test_mallocs")
	for range 100 {
		chunk()
	}
	if n := h.call("sluice_test_mallocs") - before; n != 0 {
		t.Fatalf("100 chunks of a cut stream: %d allocations", n)
	}
	h.call("proxy_on_response_body", id, 0, 1)
	h.call("proxy_on_log", id)
	h.finish(id)
	if len(h.calls) != 3 {
		t.Fatalf("%d calls, want the settlement third", len(h.calls))
	}
}

// TestWasmLLMChunksAllocateNothing: the chunks of an SSE answer whose
// usage is read (not cut) allocate nothing in filter.wasm.
func TestWasmLLMChunksAllocateNothing(t *testing.T) {
	h, _ := llmHost(t, strings.Replace(llmWasmConfig, `, "cut": {"slice": 20}`, "", 1), true) // no body: the default reserve
	const id = 2
	h.deliver(1, hostOK(t))
	h.current = id
	h.respHeaders[id] = map[string]string{"content-type": "text/event-stream"}
	h.call("proxy_on_response_headers", id, 1, 0)
	h.respChunk[id] = []byte(strings.Repeat(llmChunk, 4))
	for range 10 {
		h.call("proxy_on_response_body", id, uint64(len(h.respChunk[id])), 0)
	}
	h.call("sluice_test_gc")
	before := h.call("sluice_test_mallocs")
	for range 200 {
		h.call("proxy_on_response_body", id, uint64(len(h.respChunk[id])), 0)
	}
	if n := h.call("sluice_test_mallocs") - before; n != 0 {
		t.Fatalf("200 chunks: %d allocations", n)
	}
}

// BenchmarkRequestBodyCallback is what exporting proxy_on_request_body
// costs a filter that reads no body: one callback per body chunk of a
// request already decided (it returns at once).
func BenchmarkRequestBodyCallback(b *testing.B) {
	h := newWasmHost(b, filterWasm, benchConfig)
	if !h.configure() {
		b.Fatalf("configuration refused: %v", h.logs)
	}
	h.quiet = true
	h.request(2, benchRequest)
	h.deliver(1, hostAdmitted(b))
	h.current = 2
	b.ResetTimer()
	for range b.N {
		h.call("proxy_on_request_body", 2, 4096, 0)
	}
}
