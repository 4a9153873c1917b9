package rlsproto

import (
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/sluicehq/sluice/filter/core/descriptors"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// BenchmarkDecodeAdmitted decodes the control plane's usual answer: one
// descriptor admitted, with the sluice metadata of its limit.
func BenchmarkDecodeAdmitted(b *testing.B) {
	meta, err := structpb.NewStruct(map[string]any{MetadataKey: []any{
		map[string]any{"algorithm": "fixed_window", "limit": 1000, "window_ms": 3600e3},
	}})
	if err != nil {
		b.Fatal(err)
	}
	msg, err := proto.Marshal(&rlsv3.RateLimitResponse{
		OverallCode:     rlsv3.RateLimitResponse_OK,
		Statuses:        []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: 1, LimitRemaining: 999}},
		DynamicMetadata: meta,
	})
	if err != nil {
		b.Fatal(err)
	}
	var resp Response
	b.ReportAllocs()
	for b.Loop() {
		if err := Decode(msg, &resp); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAppendRequestFrame encodes the call of a request with one
// descriptor of one entry, as bench-envoy's requests make.
func BenchmarkAppendRequestFrame(b *testing.B) {
	descs := []descriptors.Descriptor{{Entries: []descriptors.Entry{{Key: "user", Value: "u1234"}}, HitsAddend: 1}}
	buf := make([]byte, 0, 256)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendRequestFrame(buf[:0], "bench", descs, 7)
	}
}
