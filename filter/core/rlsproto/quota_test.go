package rlsproto

import (
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func TestDecodeQuota(t *testing.T) {
	until := time.Unix(1_800_000_000, 123_456_789)
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
			{Code: rlsv3.RateLimitResponse_OK, Quota: &rlsv3.RateLimitResponse_Quota{Requests: 17, Id: "q1",
				ExpirationSpecifier: &rlsv3.RateLimitResponse_Quota_ValidUntil{ValidUntil: timestamppb.New(until)}}},
			{Code: rlsv3.RateLimitResponse_OK},
		},
	}
	msg, err := proto.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	var got Response
	if err := Decode(msg, &got); err != nil {
		t.Fatal(err)
	}
	if q := got.Statuses[0].Quota; q.Requests != 17 || q.ValidUntil != until.UnixNano() || q.ID != "q1" {
		t.Fatalf("quota %+v", q)
	}
	if q := got.Statuses[1].Quota; q != (Quota{}) {
		t.Fatalf("a status without quota decoded as %+v", q)
	}
	// A truncated quota is refused.
	bad := append([]byte{}, msg...)
	for i := range bad {
		if bad[i] == 0x2a { // status field 5, bytes
			bad[i+1] = 0x7f
			break
		}
	}
	if err := Decode(bad, &got); err == nil {
		t.Fatal("a truncated quota decoded")
	}
}
