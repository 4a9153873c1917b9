package main

import (
	"encoding/binary"
	"fmt"
	"maps"
	"math"
	"strconv"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/filter/core/headermap"
	"github.com/sluicehq/sluice/filter/core/rlsproto"
	"github.com/sluicehq/sluice/filter/proxywasm/abi"
)

// usageWasmConfig has two usage-based rate limits: tokens from a response
// trailer per API key, and tokens from dynamic metadata for everyone.
const usageWasmConfig = `{"cluster": "rls", "domain": "llm", "timeout": "100ms",
  "rate_limits": [
    {"actions": [{"request_headers": {"header_name": "x-api-key", "descriptor_key": "api_key"}}],
     "usage": {"reserve": 1, "source": {"response_trailer": "x-usage-tokens"}}},
    {"actions": [{"generic_key": {"descriptor_value": "all"}}],
     "usage": {"reserve": 0, "source": {"dynamic_metadata": {"namespace": "io.envoy.ai_gateway", "key": "llm_total_token"}}}}
  ],
  "settle": {"batch_max": 1, "interval_ms": 0}}`

// TestWasmUsageSettles runs a usage-based stream through filter.wasm's
// proxy-wasm bindings: the trailer read through proxy_on_response_trailers,
// the metadata value (a double, as Envoy serializes a Struct number) through
// proxy_get_property at proxy_on_log, and one settle call per charge at
// stream end, with the x-sluice-settle token.
func TestWasmUsageSettles(t *testing.T) {
	h := newWasmHost(t, filterWasm, usageWasmConfig)
	if !h.configure() {
		t.Fatalf("configuration refused: %v", h.logs)
	}
	req := map[string]string{":method": "POST", ":path": "/v1/chat", "x-api-key": "k1"}
	if a := h.request(2, req); a != uint64(abi.ActionPause) || len(h.calls) != 1 {
		t.Fatalf("action %d, %d calls", a, len(h.calls))
	}
	h.deliver(1, &hostAnswer{
		headers: map[string]string{":status": "200"}, trailers: map[string]string{"grpc-status": "0"},
		body: grpcAnswer(t, &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
			Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: 1}, {Code: 1}}}),
	})
	if h.resumed[2] != 1 {
		t.Fatalf("not resumed: %v", h.logs)
	}
	h.current = 2
	h.respTrailers[2] = map[string]string{"x-usage-tokens": "100"}
	h.props[2] = map[string][]byte{"metadata\x00filter_metadata\x00io.envoy.ai_gateway\x00llm_total_token": binary.LittleEndian.AppendUint64(nil, math.Float64bits(42))}
	h.call("proxy_on_response_headers", 2, 1, 0)
	h.call("proxy_on_response_body", 2, 512, 0)
	h.call("proxy_on_response_trailers", 2, 1)
	h.call("proxy_on_log", 2)
	h.call("proxy_on_done", 2)
	h.call("proxy_on_delete", 2)
	if len(h.calls) != 3 {
		t.Fatalf("%d calls, want the check and two settle calls: %v", len(h.calls), h.logs)
	}
	tokens := map[string]bool{}
	for i, want := range []struct {
		key, value string
		charge     uint64
	}{{"api_key", "k1", 99}, {"generic_key", "all", 42}} {
		pairs, err := headermap.Parse(nil, h.callHeaders[1+i])
		if err != nil {
			t.Fatal(err)
		}
		token := findHeader(pairs, rlsproto.SettleHeader)
		tokens[token] = true
		msg, err := rlsproto.ParseFrame(h.callBodies[1+i])
		if err != nil {
			t.Fatal(err)
		}
		var r rlsv3.RateLimitRequest
		if err := proto.Unmarshal(msg, &r); err != nil {
			t.Fatal(err)
		}
		if token == "" || r.Domain != "llm" || len(r.Descriptors) != 1 || r.Descriptors[0].Entries[0].Key != want.key ||
			r.Descriptors[0].Entries[0].Value != want.value || r.Descriptors[0].HitsAddend.GetValue() != want.charge {
			t.Fatalf("settle call %d: token %q, %v", i, token, &r)
		}
	}
	if len(tokens) != 2 {
		t.Fatalf("tokens %v: want two distinct", tokens)
	}
}

// TestUsageStreamHostCalls counts the host calls a usage-based stream adds
// to an admitted request's, with settlements batched (interval_ms 100):
// the response header read, and the clock at stream end. The settle call
// itself is shared by the batch and made on the tick.
func TestUsageStreamHostCalls(t *testing.T) {
	const usageCfg = `{"cluster": "rls", "domain": "llm", "timeout": "100ms",
	  "rate_limits": [{"actions": [{"request_headers": {"header_name": "x-api-key", "descriptor_key": "api_key"}}]%s}],
	  "settle": {"interval_ms": 100}}`
	counts := func(usage string) map[string]int {
		var c hostCounter
		h := newWasmHostShared(t, c.context(), filterWasmDev, fmt.Sprintf(usageCfg, usage), newHostShared())
		if !h.configure() {
			t.Fatalf("configuration refused: %v", h.logs)
		}
		stream := func(id uint32) {
			req := map[string]string{":method": "POST", ":path": "/", "x-api-key": "k" + strconv.Itoa(int(id))}
			h.headers[id], h.current = req, id
			h.call("proxy_on_context_create", uint64(id), 1)
			h.call("proxy_on_request_headers", uint64(id), uint64(len(req)), 1)
			h.deliver(uint32(len(h.calls)), &hostAnswer{
				headers: map[string]string{":status": "200"}, trailers: map[string]string{"grpc-status": "0"},
				body: grpcAnswer(t, &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
					Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: 1}}}),
			})
			h.current = id
			h.respHeaders[id] = map[string]string{"x-usage-tokens": "100"}
			h.call("proxy_on_response_headers", uint64(id), 1, 0)
			h.call("proxy_on_response_body", uint64(id), 100, 1)
			h.call("proxy_on_log", uint64(id))
			h.call("proxy_on_done", uint64(id))
			h.call("proxy_on_delete", uint64(id))
		}
		stream(2) // warm, and the first pending charge sets the tick
		h.call("sluice_test_gc")
		c.counts = map[string]int{}
		c.counting = true
		stream(3)
		c.counting = false
		return c.counts
	}
	plain := counts("")
	usage := counts(`, "usage": {"source": {"response_header": "x-usage-tokens"}}`)
	want := maps.Clone(plain)
	want["env.proxy_get_header_map_value"]++        // x-usage-tokens
	want["wasi_snapshot_preview1.clock_time_get"]++ // the stream's end
	if !maps.Equal(usage, want) {
		t.Fatalf("host calls of a usage-based stream: %v, want %v (a plain one: %v)", usage, want, plain)
	}
}
