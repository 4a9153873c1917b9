package main

import (
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
)

// TestCodeOnlyCodec: the codec reads overall_code out of full responses and
// refuses bytes that are not protobuf.
func TestCodeOnlyCodec(t *testing.T) {
	meta, err := structpb.NewStruct(map[string]any{"sluice": []any{map[string]any{"algorithm": "fixed_window", "limit": 5.0}}})
	if err != nil {
		t.Fatal(err)
	}
	c := newCodeOnlyCodec()
	for _, code := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_UNKNOWN, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		full := &rlsv3.RateLimitResponse{
			OverallCode: code,
			Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{
				Code: rlsv3.RateLimitResponse_OVER_LIMIT, LimitRemaining: 3, DurationUntilReset: durationpb.New(7),
			}},
			RawBody:         []byte("x"),
			DynamicMetadata: meta,
		}
		b, err := proto.Marshal(full)
		if err != nil {
			t.Fatal(err)
		}
		got := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT, RawBody: []byte("stale")}
		if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, got); err != nil {
			t.Fatalf("%v: %v", code, err)
		}
		if got.OverallCode != code || got.RawBody != nil {
			t.Errorf("%v: decoded %v", code, got)
		}
		if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b[:len(b)-1])}, got); err == nil {
			t.Errorf("%v: a truncated response decoded without error", code)
		}
	}
	// Other messages go through the protobuf codec.
	req := &rlsv3.RateLimitRequest{Domain: "d", HitsAddend: 2}
	data, err := c.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	var back rlsv3.RateLimitRequest
	if err := c.Unmarshal(data, &back); err != nil || !proto.Equal(&back, req) {
		t.Fatalf("request round trip: %v, %v", &back, err)
	}
}
