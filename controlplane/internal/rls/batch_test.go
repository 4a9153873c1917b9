package rls

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// randomWireRequest returns the wire bytes of a request on testPolicy's
// and quietPolicy's descriptors, now and then an invalid or undecodable
// one.
func randomWireRequest(t *testing.T, rng *rand.Rand) []byte {
	t.Helper()
	switch rng.IntN(20) {
	case 0:
		return []byte{0xff, 0xff, 0xff} // not a message
	case 1:
		b, _ := proto.Marshal(req("", desc("user=a"))) // no domain
		return b
	case 2:
		b, _ := proto.Marshal(req("test")) // no descriptor
		return b
	}
	pick := []string{"user=a", "user=b", "api=v1x", "shadow=s", "free=f", "strict=s", "gcra=g", "broad=x",
		"narrow=y", "nothing=here"}
	domains := []string{"test", "test", "test", "quiet", "elsewhere"}
	var ds []*ratelimitv3.RateLimitDescriptor
	for range 1 + rng.IntN(3) {
		if rng.IntN(6) == 0 {
			ds = append(ds, desc("org=o", fmt.Sprintf("team=t%d", rng.IntN(2))))
			continue
		}
		ds = append(ds, desc(pick[rng.IntN(len(pick))]))
	}
	r := req(domains[rng.IntN(len(domains))], ds...)
	r.HitsAddend = uint32(rng.IntN(3))
	b, err := proto.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestBatchMatchesSequential: calls answered in batches by
// ShouldRateLimitBatch get exactly the answers (bytes, or status) that the
// same calls get one by one from ShouldRateLimitWire, on two services with
// identical stores and clocks.
func TestBatchMatchesSequential(t *testing.T) {
	one, many := newFixture(t, nil), newFixture(t, nil)
	rng := rand.New(rand.NewPCG(7, 8))
	ctx := context.Background()
	total, over := 0, 0
	for round := range 300 {
		calls := make([]WireCall, 1+rng.IntN(12))
		for i := range calls {
			calls[i].Req = randomWireRequest(t, rng)
		}
		many.svc.ShouldRateLimitBatch(ctx, calls)
		for i, c := range calls {
			want, wantErr := one.svc.ShouldRateLimitWire(ctx, nil, c.Req)
			if status.Code(c.Err) != status.Code(wantErr) || (wantErr != nil && c.Err.Error() != wantErr.Error()) {
				t.Fatalf("round %d call %d: error %v, alone %v", round, i, c.Err, wantErr)
			}
			if wantErr == nil {
				// (Compared as messages: the metadata's map entries come in
				// map order.)
				var got, alone rlsv3.RateLimitResponse
				if err := errors.Join(proto.Unmarshal(c.Resp, &got), proto.Unmarshal(want, &alone)); err != nil {
					t.Fatal(err)
				}
				if !proto.Equal(&got, &alone) {
					t.Fatalf("round %d call %d: answers differ:\n batch %v\n alone %v", round, i, &got, &alone)
				}
				if alone.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
					over++
				}
			} else if len(c.Resp) > 0 {
				t.Fatalf("round %d call %d: an answer with the error", round, i)
			}
			total++
		}
		d := rng.Int64N(int64(3e9))
		one.clock.Advance(time.Duration(d))
		many.clock.Advance(time.Duration(d))
	}
	if over < total/10 || over > total*9/10 {
		t.Fatalf("%d of %d calls over limit: the sequence does not exercise both answers", over, total)
	}
}

// TestBatchStoreFailure: when the store fails, every call of the batch is
// answered by its policies' failure modes, as alone.
func TestBatchStoreFailure(t *testing.T) {
	st := &failingStore{}
	f := newFixture(t, st)
	closed, _ := proto.Marshal(req("test", desc("strict=s")))
	open, _ := proto.Marshal(req("test", desc("user=u")))
	calls := []WireCall{{Req: closed}, {Req: open}, {Req: closed}}
	f.svc.ShouldRateLimitBatch(context.Background(), calls)
	if st.calls.Load() != 1 {
		t.Fatalf("%d store calls for one batch", st.calls.Load())
	}
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OVER_LIMIT, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		var r rlsv3.RateLimitResponse
		if calls[i].Err != nil {
			t.Fatal(calls[i].Err)
		}
		if err := proto.Unmarshal(calls[i].Resp, &r); err != nil {
			t.Fatal(err)
		}
		if r.OverallCode != want {
			t.Errorf("call %d: %v, want %v", i, r.OverallCode, want)
		}
	}
}
