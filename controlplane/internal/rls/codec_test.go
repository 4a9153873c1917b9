package rls

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/algorithms"
)

// TestCodecCoversEveryField: marshalResponse copies every field of
// RateLimitResponse but dynamic_metadata; a new field in a newer
// go-control-plane must be added there (and here).
func TestCodecCoversEveryField(t *testing.T) {
	fields := (&rlsv3.RateLimitResponse{}).ProtoReflect().Descriptor().Fields()
	var names []string
	for i := range fields.Len() {
		names = append(names, string(fields.Get(i).Name()))
	}
	want := slices.Clone(responseFields)
	slices.Sort(names)
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Fatalf("RateLimitResponse has fields %v; marshalResponse handles %v", names, want)
	}
	if f := fields.ByName("dynamic_metadata"); f == nil || f.Number() != metadataField {
		t.Fatalf("dynamic_metadata is not field %d", metadataField)
	}
}

// randomValue returns a random google.protobuf.Value, nesting at most depth
// levels of structs and lists.
func randomValue(rng *rand.Rand, depth int) *structpb.Value {
	kinds := 4
	if depth > 0 {
		kinds = 6
	}
	switch rng.IntN(kinds + 1) {
	case 0:
		return structpb.NewNullValue()
	case 1:
		nums := []float64{0, -0.5, 1, 1e300, math.Inf(-1), math.NaN(), float64(rng.Int64())}
		return structpb.NewNumberValue(nums[rng.IntN(len(nums))])
	case 2:
		strs := []string{"", "fixed_window", "ünïcødé", "a\x00b", string(make([]byte, 300))}
		return structpb.NewStringValue(strs[rng.IntN(len(strs))])
	case 3:
		return structpb.NewBoolValue(rng.IntN(2) == 0)
	case 4:
		return &structpb.Value{} // no kind set
	case 5:
		return structpb.NewStructValue(randomStruct(rng, depth-1))
	}
	l := &structpb.ListValue{}
	for range rng.IntN(5) {
		l.Values = append(l.Values, randomValue(rng, depth-1))
	}
	return structpb.NewListValue(l)
}

// randomStruct returns a random google.protobuf.Struct.
func randomStruct(rng *rand.Rand, depth int) *structpb.Struct {
	s := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for i := range rng.IntN(6) {
		s.Fields["k"+strconv.Itoa(i)+string(rune('a'+rng.IntN(26)))] = randomValue(rng, depth)
	}
	return s
}

// decodeResponse marshals r with the codec of svc (nil: none) and parses
// the bytes back.
func decodeResponse(t *testing.T, svc *Service, r *rlsv3.RateLimitResponse) *rlsv3.RateLimitResponse {
	t.Helper()
	data, err := NewCodec(svc).Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var got rlsv3.RateLimitResponse
	if err := proto.Unmarshal(data.Materialize(), &got); err != nil {
		t.Fatalf("the codec's bytes do not parse: %v", err)
	}
	return &got
}

// TestCodecRoundTrip: whatever a response holds, the codec's bytes parse
// back to an equal message.
func TestCodecRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		r := &rlsv3.RateLimitResponse{
			OverallCode:     rlsv3.RateLimitResponse_Code(rng.IntN(3)),
			DynamicMetadata: randomStruct(rng, 3),
		}
		for range rng.IntN(3) {
			r.Statuses = append(r.Statuses, &rlsv3.RateLimitResponse_DescriptorStatus{
				Code:               rlsv3.RateLimitResponse_OVER_LIMIT,
				LimitRemaining:     rng.Uint32(),
				DurationUntilReset: durationpb.New(1500),
				CurrentLimit:       &rlsv3.RateLimitResponse_RateLimit{Name: "n", RequestsPerUnit: 7},
			})
		}
		if rng.IntN(2) == 0 {
			r.ResponseHeadersToAdd = []*corev3.HeaderValue{{Key: "RateLimit", Value: `"a";r=1;t=2`}}
			r.RequestHeadersToAdd = []*corev3.HeaderValue{{Key: "x", Value: "y"}}
			r.RawBody = []byte("body")
			r.Quota = &rlsv3.RateLimitResponse_Quota{Requests: 3, Id: "q"}
		}
		if got := decodeResponse(t, nil, r); !proto.Equal(got, r) {
			t.Fatalf("case %d: round trip changed the response:\n got %v\nwant %v", i, got, r)
		}
	}
}

// TestCodecServiceResponses: real responses (shared metadata, headers,
// over limit) round-trip.
func TestCodecServiceResponses(t *testing.T) {
	f := newFixture(t, nil)
	for i := range 6 {
		r, err := f.svc.ShouldRateLimit(context.Background(), req("test", desc("user=codec"), desc("api=v1/x"), desc("free=x")))
		if err != nil {
			t.Fatal(err)
		}
		if got := decodeResponse(t, f.svc, r); !proto.Equal(got, r) {
			t.Fatalf("call %d: round trip changed the response:\n got %v\nwant %v", i, got, r)
		}
		r = f.call(t, req("test", desc("user=single")))
		if got := decodeResponse(t, f.svc, r); !proto.Equal(got, r) {
			t.Fatalf("call %d: round trip changed the response:\n got %v\nwant %v", i, got, r)
		}
	}
}

// TestCodecOtherMessages: other messages, and responses without metadata,
// are gRPC's protobuf codec's business, byte for byte.
func TestCodecOtherMessages(t *testing.T) {
	c := NewCodec(nil)
	if c.Name() != "proto" {
		t.Fatalf("Name %q", c.Name())
	}
	for _, m := range []proto.Message{
		&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING},
		&rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK},
	} {
		got, err := c.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		want, err := c.base.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if string(got.Materialize()) != string(want.Materialize()) {
			t.Errorf("%T: codec bytes differ from gRPC's codec", m)
		}
		back := m.ProtoReflect().New().Interface()
		if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(got.Materialize())}, back); err != nil || !proto.Equal(back, m) {
			t.Errorf("%T: Unmarshal: %v, %v", m, back, err)
		}
	}
	if _, err := c.Marshal("not a message"); err == nil {
		t.Error("Marshal of a string: no error")
	}
}

// randomRequest returns a random RateLimitRequest, sometimes with the parts
// decodeRequest leaves to protobuf-go (limit overrides, hits_addend
// wrappers, unknown fields).
func randomRequest(rng *rand.Rand) *rlsv3.RateLimitRequest {
	strs := []string{"", "user", "ünï", "a:b{c}", strings.Repeat("v", 200)}
	r := &rlsv3.RateLimitRequest{Domain: strs[rng.IntN(len(strs))], HitsAddend: uint32(rng.IntN(3))}
	for range rng.IntN(4) {
		d := &ratelimitv3.RateLimitDescriptor{IsNegativeHits: rng.IntN(8) == 0}
		for range rng.IntN(4) {
			d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: strs[rng.IntN(len(strs))], Value: strs[rng.IntN(len(strs))]})
		}
		switch rng.IntN(10) {
		case 0:
			d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_MINUTE}
		case 1:
			d.HitsAddend = wrapperspb.UInt64(7)
		}
		r.Descriptors = append(r.Descriptors, d)
	}
	if rng.IntN(10) == 0 {
		r.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 1))
	}
	return r
}

// TestCodecDecodesLikeProtobuf: for valid requests, and for random
// corruptions of them, the codec's Unmarshal gives what proto.Unmarshal
// gives: an equal message, or an error.
func TestCodecDecodesLikeProtobuf(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	c := NewCodec(nil)
	fast := 0
	reused := new(arena)
	for i := range 20000 {
		b, err := proto.MarshalOptions{AllowPartial: true}.Marshal(randomRequest(rng))
		if err != nil {
			t.Fatal(err)
		}
		if i%7 == 0 { // a string of invalid UTF-8: a domain, or an entry's value
			if rng.IntN(2) == 0 {
				b = protowire.AppendString(protowire.AppendTag(b, 1, protowire.BytesType), "\xff\xfe")
			} else {
				e := protowire.AppendString(protowire.AppendTag(nil, 2, protowire.BytesType), "ok\xc0")
				d := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), e)
				b = protowire.AppendBytes(protowire.AppendTag(b, 2, protowire.BytesType), d)
			}
		}
		if i%11 == 0 { // a known field with a wire type it does not have
			var wrong []byte
			switch rng.IntN(3) {
			case 0:
				wrong = protowire.AppendVarint(protowire.AppendTag(nil, protowire.Number(1+rng.IntN(2)), protowire.VarintType), 3)
			case 1:
				wrong = protowire.AppendBytes(protowire.AppendTag(nil, 3, protowire.BytesType), nil)
			default:
				inner := protowire.AppendBytes(protowire.AppendTag(nil, 4, protowire.BytesType), nil)
				if rng.IntN(2) == 0 {
					e := protowire.AppendVarint(protowire.AppendTag(nil, protowire.Number(1+rng.IntN(2)), protowire.VarintType), 1)
					inner = protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), e)
				}
				wrong = protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), inner)
			}
			b = append(b, wrong...)
		}
		if i%2 == 1 && len(b) > 0 { // corrupt it
			b = slices.Clone(b)
			switch rng.IntN(3) {
			case 0:
				b[rng.IntN(len(b))] ^= byte(1 + rng.IntN(255))
			case 1:
				b = b[:rng.IntN(len(b))]
			default:
				b = append(b, byte(rng.IntN(256)))
			}
		}
		want := &rlsv3.RateLimitRequest{}
		wantErr := proto.Unmarshal(b, want)
		got := &rlsv3.RateLimitRequest{Domain: "stale"}
		gotErr := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, got)
		if (gotErr == nil) != (wantErr == nil) {
			t.Fatalf("case %d %x: error %v, protobuf-go's %v", i, b, gotErr, wantErr)
		}
		if wantErr == nil && !proto.Equal(got, want) {
			t.Fatalf("case %d %x:\n got %v\nwant %v", i, b, got, want)
		}
		if decodeRequest(b, &rlsv3.RateLimitRequest{}) {
			fast++
			// The same through the arena the wire path reuses.
			reused.reset()
			r := reused.request()
			if !decodeRequestIn(b, r, reused) || !proto.Equal(r, want) {
				t.Fatalf("case %d %x: through an arena:\n got %v\nwant %v", i, b, r, want)
			}
		}
	}
	if fast < 5000 {
		t.Errorf("only %d of 20000 requests took the fast path", fast)
	}
}

// TestSharedMetadata: the dynamic_metadata built from the shared, per-limit
// parts equals the one built afresh for every outcome, whatever the mix of
// outcomes (over limit, decided by failure_mode, shadow, unlimited,
// unmatched, limit overrides).
func TestSharedMetadata(t *testing.T) {
	set := parse(t, testPolicy)
	ver := newVersion(set, nil, nil)
	dom := set.Domain("test")
	lims := dom.Limits()
	override, err := overrideLimit(dom, &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 4, Unit: typev3.RateLimitUnit_SECOND})
	if err != nil {
		t.Fatal(err)
	}
	lims = append(lims, override)
	rng := rand.New(rand.NewPCG(7, 8))
	for i := range 5000 {
		outs := make([]outcome, 1+rng.IntN(4))
		for j := range outs {
			if rng.IntN(5) == 0 {
				continue // nothing limits the descriptor
			}
			l := lims[rng.IntN(len(lims))]
			outs[j] = outcome{lim: l, info: ver.infoOf(l), failed: rng.IntN(6) == 0,
				res: algorithms.Result{Allowed: rng.IntN(3) > 0, Remaining: 2, RetryAfter: int64(rng.IntN(3)) * int64(time.Second)}}
		}
		ref := make([]*structpb.Value, len(outs))
		for j := range outs {
			ref[j] = metadataValue(&outs[j])
		}
		if got, want := limitMetadata(outs), metadataStruct(ref); !proto.Equal(got, want) {
			t.Fatalf("case %d: shared metadata\n%v\nwant\n%v", i, got, want)
		}
	}
}

// TestArenaOverflow: requests with more descriptors and entries than an
// arena holds decode alike, and a reset arena keeps nothing of them.
func TestArenaOverflow(t *testing.T) {
	a := new(arena)
	for _, shape := range [][2]int{{1, 1}, {arenaDescriptors + 3, 2}, {2, arenaEntries + 5}, {3, 7}, {arenaDescriptors, 2}, {1, 1}} {
		want := &rlsv3.RateLimitRequest{Domain: "d"}
		for i := range shape[0] {
			d := &ratelimitv3.RateLimitDescriptor{}
			for j := range shape[1] {
				d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: fmt.Sprint("k", i), Value: fmt.Sprint("v", i, j)})
			}
			want.Descriptors = append(want.Descriptors, d)
		}
		b, err := proto.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		a.reset()
		r := a.request()
		if !decodeRequestIn(b, r, a) || !proto.Equal(r, want) {
			t.Fatalf("shape %v:\n got %v\nwant %v", shape, r, want)
		}
	}
	a.reset()
	for i := range a.ents {
		if a.ents[i].Key != "" || a.ents[i].Value != "" || a.eptrs[i] != nil {
			t.Fatalf("entry %d kept after reset", i)
		}
	}
	for i := range a.descs {
		if a.descs[i].Entries != nil || a.dptrs[i] != nil {
			t.Fatalf("descriptor %d kept after reset", i)
		}
	}
}

// TestAppendPlainMatchesProto: the common answer's hand encoding is
// protobuf-go's, byte for byte, over random values (negative enums and
// durations, empty and nil parts included).
func TestAppendPlainMatchesProto(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	pick := func(vals ...int64) int64 { return vals[rng.IntN(len(vals))] }
	for i := range 5000 {
		r := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_Code(pick(0, 1, 2, -1, math.MaxInt32))}
		for range rng.IntN(4) {
			st := &rlsv3.RateLimitResponse_DescriptorStatus{
				Code:           rlsv3.RateLimitResponse_Code(pick(0, 1, 2, -5)),
				LimitRemaining: uint32(pick(0, 1, 127, 128, math.MaxUint32)),
			}
			if rng.IntN(4) > 0 {
				st.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{
					RequestsPerUnit: uint32(pick(0, 1, 300, math.MaxUint32)),
					Unit:            rlsv3.RateLimitResponse_RateLimit_Unit(pick(0, 1, 4, -2)),
					Name:            []string{"", "user#0", strings.Repeat("n", 200)}[rng.IntN(3)],
				}
			}
			if rng.IntN(4) > 0 {
				st.DurationUntilReset = &durationpb.Duration{Seconds: pick(0, 1, -3, math.MaxInt64), Nanos: int32(pick(0, 5e8, -1))}
			}
			r.Statuses = append(r.Statuses, st)
		}
		if !plainResponse(r) {
			t.Fatalf("case %d: not plain: %v", i, r)
		}
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendPlain(nil, r); string(got) != string(want) {
			t.Fatalf("case %d: appendPlain\n got %x\nwant %x\nfor %v", i, got, want, r)
		}
	}
}

func TestPlainResponse(t *testing.T) {
	limit := func() *rlsv3.RateLimitResponse_DescriptorStatus {
		return &rlsv3.RateLimitResponse_DescriptorStatus{CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Name: "a"}}
	}
	for name, r := range map[string]*rlsv3.RateLimitResponse{
		"response headers": {ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "k"}}},
		"request headers":  {RequestHeadersToAdd: []*corev3.HeaderValue{{Key: "k"}}},
		"raw body":         {RawBody: []byte("b")},
		"quota":            {Quota: &rlsv3.RateLimitResponse_Quota{Requests: 1}},
		"status quota":     {Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Quota: &rlsv3.RateLimitResponse_Quota{}}}},
		"unit multiplier": {Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{
			UnitMultiplier: wrapperspb.UInt32(2)}}}},
		"nil status": {Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{limit(), nil}},
	} {
		if plainResponse(r) {
			t.Errorf("%s: taken for the common answer", name)
		}
	}
	if !plainResponse(&rlsv3.RateLimitResponse{Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{limit()}}) {
		t.Error("the common answer is not plain")
	}
}

func TestSizePlain(t *testing.T) {
	r := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
		{Code: 2, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Name: "a", RequestsPerUnit: 300, Unit: 1}, LimitRemaining: 9,
			DurationUntilReset: &durationpb.Duration{Seconds: 1, Nanos: 5}},
		{},
	}}
	if got, want := sizePlain(r), len(appendPlain(nil, r)); got != want {
		t.Fatalf("sizePlain = %d, encoding has %d bytes", got, want)
	}
}
