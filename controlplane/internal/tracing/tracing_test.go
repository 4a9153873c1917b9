package tracing

import (
	"testing"

	rlscommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
)

func TestSummarize(t *testing.T) {
	req, _ := proto.Marshal(&rlsv3.RateLimitRequest{Domain: "default/eg/http", HitsAddend: 3,
		Descriptors: []*rlscommonv3.RateLimitDescriptor{{Entries: []*rlscommonv3.RateLimitDescriptor_Entry{{Key: "a", Value: "b"}}}, {}}})
	for _, tc := range []struct {
		name   string
		b      []byte
		domain string
		n      int
	}{
		{"request", req, "default/eg/http", 2},
		{"empty", nil, "", 0},
		{"truncated", req[:len(req)-3], "default/eg/http", 1},
		{"garbage", []byte{0xff, 0xff, 0xff}, "", 0},
	} {
		if d, n := summarize(tc.b); d != tc.domain || n != tc.n {
			t.Errorf("%s: %q %d, want %q %d", tc.name, d, n, tc.domain, tc.n)
		}
	}
	over, _ := proto.Marshal(&rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OK}}})
	for _, tc := range []struct {
		b    []byte
		want int
	}{{over, 2}, {nil, 0}, {[]byte{0x08}, -1}} {
		if got := overallCode(tc.b); got != tc.want {
			t.Errorf("overallCode(%x) = %d, want %d", tc.b, got, tc.want)
		}
	}
}

func TestNilTracer(t *testing.T) {
	var tr *Tracer
	if tr.Headers() != nil || tr.Shutdown(t.Context()) != nil {
		t.Error("a nil Tracer keeps headers or fails to shut down")
	}
}
