package rlsproto

import (
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/filter/core/descriptors"
)

// TestSettleFrameMatchesGeneratedTypes: a settle call is a RateLimitRequest
// whose descriptors each carry their charge as hits_addend, or their
// refund as hits_addend with is_negative_hits, with no request-level
// hits_addend and no quota marker.
func TestSettleFrameMatchesGeneratedTypes(t *testing.T) {
	descs := []descriptors.Descriptor{
		{Entries: []descriptors.Entry{{Key: "api_key", Value: "k1"}}},
		{Entries: []descriptors.Entry{{Key: "api_key", Value: "k2"}, {Key: "path", Value: "/v1/chat"}}},
		{Entries: []descriptors.Entry{{Key: "k", Value: ""}}},
	}
	amounts := []int64{99, -(1 << 40), 1}
	frame := AppendSettleFrame([]byte("x"), "llm", descs, amounts)
	msg, err := ParseFrame(frame[1:])
	if err != nil {
		t.Fatal(err)
	}
	var got rlsv3.RateLimitRequest
	if err := proto.Unmarshal(msg, &got); err != nil {
		t.Fatal(err)
	}
	if got.Domain != "llm" || got.HitsAddend != 0 || len(got.Descriptors) != 3 || len(got.ProtoReflect().GetUnknown()) != 0 {
		t.Fatalf("settle request %v", &got)
	}
	for i, d := range got.Descriptors {
		if d.HitsAddend == nil || d.HitsAddend.Value != magnitude(amounts[i]) || d.IsNegativeHits != (amounts[i] < 0) ||
			len(d.Entries) != len(descs[i].Entries) {
			t.Fatalf("descriptor %d: %v", i, d)
		}
		for j, e := range d.Entries {
			if e.Key != descs[i].Entries[j].Key || e.Value != descs[i].Entries[j].Value {
				t.Fatalf("descriptor %d entry %d: %v", i, j, e)
			}
		}
	}
}
