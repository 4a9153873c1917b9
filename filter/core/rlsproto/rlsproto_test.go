package rlsproto

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/filter/core/descriptors"
)

// generated converts descriptors to the generated request the encoder must
// be equivalent to.
func generated(domain string, descs []descriptors.Descriptor) *rlsv3.RateLimitRequest {
	cost, uniform, _ := requestCost(descs)
	req := &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: cost}
	for _, d := range descs {
		gd := &ratelimitv3.RateLimitDescriptor{}
		for _, e := range d.Entries {
			gd.Entries = append(gd.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: e.Key, Value: e.Value})
		}
		if !uniform && d.HitsAddend != 1 {
			gd.HitsAddend = wrapperspb.UInt64(uint64(d.HitsAddend))
		}
		req.Descriptors = append(req.Descriptors, gd)
	}
	return req
}

func TestRequestMatchesGeneratedTypes(t *testing.T) {
	tests := []struct {
		name   string
		domain string
		descs  []descriptors.Descriptor
	}{
		{"one", "edge", []descriptors.Descriptor{{HitsAddend: 1, Entries: []descriptors.Entry{{Key: "remote_address", Value: "10.0.0.1"}}}}},
		{"uniform cost", "edge", []descriptors.Descriptor{
			{HitsAddend: 5, Entries: []descriptors.Entry{{Key: "a", Value: "1"}, {Key: "b", Value: "2"}}},
			{HitsAddend: 5, Entries: []descriptors.Entry{{Key: "c", Value: "3"}}},
		}},
		{"mixed cost", "edge", []descriptors.Descriptor{
			{HitsAddend: 1, Entries: []descriptors.Entry{{Key: "a", Value: "1"}}},
			{HitsAddend: 300, Entries: []descriptors.Entry{{Key: "c", Value: "3"}}},
		}},
		{"empty value", "d", []descriptors.Descriptor{{HitsAddend: 1, Entries: []descriptors.Entry{{Key: "k", Value: ""}}}}},
		{"no descriptors", "d", nil},
		{"probe", "llm", []descriptors.Descriptor{{HitsAddend: 0, Usage: true, Entries: []descriptors.Entry{{Key: "k", Value: "v"}}}}},
		{"usage reserve", "llm", []descriptors.Descriptor{
			{HitsAddend: 1, Entries: []descriptors.Entry{{Key: "a", Value: "1"}}},
			{HitsAddend: 1, Usage: true, Entries: []descriptors.Entry{{Key: "c", Value: "3"}}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkRequest(t, tt.domain, tt.descs)
		})
	}
}

func checkRequest(t *testing.T, domain string, descs []descriptors.Descriptor) {
	t.Helper()
	for _, caller := range []uint64{1, 300, 1<<63 | 5} {
		msg := AppendRequest(nil, domain, descs, caller)
		if len(msg) != RequestLen(domain, descs, caller) {
			t.Fatalf("caller %d: RequestLen = %d, encoded %d bytes", caller, RequestLen(domain, descs, caller), len(msg))
		}
		var got rlsv3.RateLimitRequest
		if err := proto.Unmarshal(msg, &got); err != nil {
			t.Fatalf("generated code cannot parse the request: %v", err)
		}
		want := generated(domain, descs)
		if _, _, quota := requestCost(descs); quota { // a usage-based request asks for no quota
			want.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, QuotaField, protowire.VarintType), caller))
		}
		if !proto.Equal(&got, want) {
			t.Fatalf("caller %d: got  %v\nwant %v", caller, &got, want)
		}
	}
	msg := AppendRequest(nil, domain, descs, 0) // no caller named: 1
	if !bytes.Equal(msg, AppendRequest(nil, domain, descs, 1)) {
		t.Fatal("caller 0 is not sent as 1")
	}
	var got rlsv3.RateLimitRequest
	if err := proto.Unmarshal(msg, &got); err != nil {
		t.Fatalf("generated code cannot parse the request: %v", err)
	}
	want := generated(domain, descs)
	if _, _, quota := requestCost(descs); quota {
		want.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, QuotaField, protowire.VarintType), 1))
	}
	if !proto.Equal(&got, want) {
		t.Fatalf("got  %v\nwant %v", &got, want)
	}
	// The same bytes the generated code writes (it orders fields the same way).
	gen, err := proto.MarshalOptions{Deterministic: true}.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(msg, gen) {
		t.Fatalf("encoding differs from the generated code's:\n got  %x\n want %x", msg, gen)
	}
	frame := AppendRequestFrame([]byte("prefix"), domain, descs, 1)
	if !bytes.HasPrefix(frame, []byte("prefix")) {
		t.Fatal("AppendRequestFrame overwrote dst")
	}
	body, err := ParseFrame(frame[len("prefix"):])
	if err != nil || !bytes.Equal(body, msg) {
		t.Fatalf("frame round trip: %v", err)
	}
}

// TestProbeAndUsageRequest: a descriptor of cost 0 (a usage-based probe)
// carries its own hits_addend 0, since a request-level 0 means 1; a
// request with a usage-based descriptor does not ask for quotas (leases).
func TestProbeAndUsageRequest(t *testing.T) {
	probe := descriptors.Descriptor{HitsAddend: 0, Usage: true, Entries: []descriptors.Entry{{Key: "user", Value: "u1"}}}
	plain := descriptors.Descriptor{HitsAddend: 1, Entries: []descriptors.Entry{{Key: "ip", Value: "10.0.0.1"}}}
	var got rlsv3.RateLimitRequest
	if err := proto.Unmarshal(AppendRequest(nil, "llm", []descriptors.Descriptor{probe, plain}, 7), &got); err != nil {
		t.Fatal(err)
	}
	if got.HitsAddend != 1 || got.Descriptors[0].HitsAddend == nil || got.Descriptors[0].HitsAddend.Value != 0 ||
		got.Descriptors[1].HitsAddend != nil {
		t.Fatalf("probe not sent as a per-descriptor hits_addend 0: %v", &got)
	}
	if len(got.ProtoReflect().GetUnknown()) != 0 {
		t.Fatalf("a usage-based request asked for quotas: unknown fields %x", got.ProtoReflect().GetUnknown())
	}
	if err := proto.Unmarshal(AppendRequest(nil, "llm", []descriptors.Descriptor{plain}, 7), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.ProtoReflect().GetUnknown()) == 0 {
		t.Fatal("a request-priced request no longer asks for quotas")
	}
}

func TestRequestRandomRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	randString := func(max int) string { // valid UTF-8, as descriptors.Set guarantees
		r := make([]rune, rng.IntN(max))
		for i := range r {
			r[i] = rune(rng.IntN(0xD000))
		}
		return string(r)
	}
	for i := 0; i < 500; i++ {
		descs := make([]descriptors.Descriptor, rng.IntN(5))
		for j := range descs {
			descs[j].HitsAddend = uint32(1 + rng.IntN(3))
			if rng.IntN(10) == 0 {
				descs[j].HitsAddend = uint32(rng.Uint32()) | 1
			}
			for k := rng.IntN(4) + 1; k > 0; k-- {
				descs[j].Entries = append(descs[j].Entries, descriptors.Entry{Key: randString(20) + "k", Value: randString(300)})
			}
		}
		checkRequest(t, "dom"+strconv.Itoa(i), descs)
	}
}

func limitMetadata(t *testing.T, elems ...any) *structpb.Struct {
	t.Helper()
	s, err := structpb.NewStruct(map[string]any{
		"other":     map[string]any{"x": 1},
		MetadataKey: elems,
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestDecodeResponseFromGeneratedTypes(t *testing.T) {
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
			{
				Code: rlsv3.RateLimitResponse_OK,
				CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{
					Name: "per-ip", RequestsPerUnit: 100, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE,
					UnitMultiplier: wrapperspb.UInt32(5),
				},
				LimitRemaining:     42,
				DurationUntilReset: durationpb.New(31*time.Second + 500*time.Millisecond),
			},
			{
				Code:               rlsv3.RateLimitResponse_OVER_LIMIT,
				CurrentLimit:       &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 7, Unit: rlsv3.RateLimitResponse_RateLimit_WEEK},
				DurationUntilReset: durationpb.New(2 * time.Second),
				Quota:              &rlsv3.RateLimitResponse_Quota{Id: "q"},
			},
			{Code: rlsv3.RateLimitResponse_OK},
		},
		ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "x-a", Value: "1"}, {Key: "x-raw", RawValue: []byte("raw")}},
		RequestHeadersToAdd:  []*corev3.HeaderValue{{Key: "x-b", Value: "2"}},
		RawBody:              []byte("ignored"),
		DynamicMetadata: limitMetadata(t,
			map[string]any{"algorithm": "reserve", "limit": 100.0, "window_ms": 60000.0, "burst": 20.0, "extra": true, "failure_mode": "open", "name": "api_key#0", "wait_ms": 250.5},
			map[string]any{"algorithm": "fixed_window", "limit": 7.0, "window_ms": 604800000.0, "retry_after_ms": 1250.5, "failure_mode": "closed"},
			map[string]any{},
		),
		Quota: &rlsv3.RateLimitResponse_Quota{Requests: 3},
	}
	msg, err := proto.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	var got Response
	if err := Decode(msg, &got); err != nil {
		t.Fatal(err)
	}
	if got.OverallCode != CodeOverLimit || len(got.Statuses) != 3 {
		t.Fatalf("got %+v", got)
	}
	s0 := got.Statuses[0]
	if s0.Code != CodeOK || !s0.HasLimit || s0.Name != "per-ip" || s0.RequestsPerUnit != 100 || s0.Unit != algorithms.UnitMinute ||
		s0.UnitMultiplier != 5 || s0.Window() != int64(5*time.Minute) || s0.LimitRemaining != 42 ||
		!s0.HasReset || s0.DurationUntilReset != int64(31500*time.Millisecond) {
		t.Fatalf("status 0: %+v", s0)
	}
	s1 := got.Statuses[1]
	if s1.Code != CodeOverLimit || s1.Window() != int64(7*24*time.Hour) || s1.DurationUntilReset != int64(2*time.Second) {
		t.Fatalf("status 1: %+v", s1)
	}
	if s2 := got.Statuses[2]; s2.HasLimit || s2.HasReset || s2.Window() != 0 {
		t.Fatalf("status 2: %+v", s2)
	}
	if len(got.ResponseHeadersToAdd) != 2 || got.ResponseHeadersToAdd[0] != (Header{Key: "x-a", Value: "1"}) ||
		got.ResponseHeadersToAdd[1] != (Header{Key: "x-raw", Value: "raw"}) {
		t.Fatalf("response headers: %+v", got.ResponseHeadersToAdd)
	}
	if len(got.RequestHeadersToAdd) != 1 || got.RequestHeadersToAdd[0] != (Header{Key: "x-b", Value: "2"}) {
		t.Fatalf("request headers: %+v", got.RequestHeadersToAdd)
	}
	if !got.HasLimits || len(got.Limits) != 3 {
		t.Fatalf("limits: %+v", got.Limits)
	}
	if got.Limits[0] != (LimitInfo{Algorithm: "reserve", Limit: 100, WindowMs: 60000, Burst: 20, FailureMode: "open", Name: "api_key#0", WaitMs: 250.5}) ||
		got.Limits[1] != (LimitInfo{Algorithm: "fixed_window", Limit: 7, WindowMs: 604800000, RetryAfterMs: 1250.5, FailureMode: "closed"}) ||
		got.Limits[2] != (LimitInfo{}) {
		t.Fatalf("limits: %+v", got.Limits)
	}

	// Reuse: a second decode replaces everything.
	msg2, _ := proto.Marshal(&rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK})
	if err := Decode(msg2, &got); err != nil {
		t.Fatal(err)
	}
	if got.OverallCode != CodeOK || len(got.Statuses) != 0 || got.HasLimits || len(got.Limits) != 0 || len(got.ResponseHeadersToAdd) != 0 {
		t.Fatalf("decode did not reset: %+v", got)
	}
}

func TestDecodeMetadataOddShapes(t *testing.T) {
	for _, tt := range []struct {
		name string
		meta *structpb.Struct
		want []LimitInfo
		has  bool
	}{
		{"absent", nil, nil, false},
		{"other keys only", &structpb.Struct{Fields: map[string]*structpb.Value{"x": structpb.NewNumberValue(1)}}, nil, false},
		{"not a list", &structpb.Struct{Fields: map[string]*structpb.Value{MetadataKey: structpb.NewStringValue("x")}}, nil, true},
		{"non-struct elements keep their place", &structpb.Struct{Fields: map[string]*structpb.Value{MetadataKey: structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{
			structpb.NewNumberValue(3),
			structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
				"algorithm": structpb.NewNumberValue(1), "limit": structpb.NewStringValue("9"), "window_ms": structpb.NewNumberValue(10),
				"failure_mode": structpb.NewBoolValue(true),
			}}),
			structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
				"failure_mode": structpb.NewStringValue("closed"),
			}}),
		}})}}, []LimitInfo{{}, {WindowMs: 10}, {FailureMode: "closed"}}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			msg, err := proto.Marshal(&rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, DynamicMetadata: tt.meta})
			if err != nil {
				t.Fatal(err)
			}
			var got Response
			if err := Decode(msg, &got); err != nil {
				t.Fatal(err)
			}
			if got.HasLimits != tt.has || len(got.Limits) != len(tt.want) {
				t.Fatalf("got %+v (has %v), want %+v (has %v)", got.Limits, got.HasLimits, tt.want, tt.has)
			}
			for i := range tt.want {
				if got.Limits[i] != tt.want[i] {
					t.Fatalf("limit %d: got %+v want %+v", i, got.Limits[i], tt.want[i])
				}
			}
		})
	}
}

func TestDecodeRejectsMalformed(t *testing.T) {
	var r Response
	for _, bad := range [][]byte{
		{0x08},             // truncated varint
		{0x12, 0x05, 0x08}, // statuses longer than the message
		{0x0a, 0x00},       // overall_code with the wrong wire type
		{0x00},             // field number 0
		{0x0b},             // group wire type
		{0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, // varint overflow
	} {
		if err := Decode(bad, &r); err == nil {
			t.Errorf("Decode(%x) accepted a malformed message", bad)
		}
	}
}

func TestParseFrame(t *testing.T) {
	frame := func(flag byte, n uint32, body string) []byte {
		b := []byte{flag}
		b = binary.BigEndian.AppendUint32(b, n)
		return append(b, body...)
	}
	if m, err := ParseFrame(frame(0, 3, "abc")); err != nil || string(m) != "abc" {
		t.Fatalf("got %q %v", m, err)
	}
	if m, err := ParseFrame(frame(0, 0, "")); err != nil || len(m) != 0 {
		t.Fatalf("empty message: %q %v", m, err)
	}
	for _, tt := range []struct {
		body []byte
		err  error
	}{
		{nil, ErrFrameMissing},
		{[]byte{0, 0, 0}, ErrFrameMissing},
		{frame(1, 3, "abc"), ErrCompressed},
		{frame(0, 4, "abc"), ErrFrameLength},
		{frame(0, 2, "abc"), ErrFrameLength},
	} {
		if _, err := ParseFrame(tt.body); err != tt.err {
			t.Errorf("ParseFrame(%x) = %v, want %v", tt.body, err, tt.err)
		}
	}
}

func TestGRPCHelpers(t *testing.T) {
	for _, tt := range []struct {
		v    string
		code int
		ok   bool
	}{{"0", 0, true}, {"14", 14, true}, {"", 0, false}, {"1a", 0, false}, {"1234", 0, false}, {"-1", 0, false}} {
		code, ok := ParseGRPCStatus(tt.v)
		if code != tt.code || ok != tt.ok {
			t.Errorf("ParseGRPCStatus(%q) = %d, %v", tt.v, code, ok)
		}
	}
	for _, tt := range []struct {
		d    time.Duration
		want string
	}{{20 * time.Millisecond, "20m"}, {1500 * time.Microsecond, "2m"}, {0, "1m"}, {200000 * time.Second, "200000S"}} {
		if got := string(AppendGRPCTimeout(nil, int64(tt.d))); got != tt.want {
			t.Errorf("AppendGRPCTimeout(%v) = %q, want %q", tt.d, got, tt.want)
		}
	}
}

func TestDecodeAllocatesNothingOnceWarm(t *testing.T) {
	msg, _ := proto.Marshal(&rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
			{Code: rlsv3.RateLimitResponse_OK, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 5, Unit: 1}},
		},
		DynamicMetadata: limitMetadata(t, map[string]any{"algorithm": "token_bucket", "limit": 5.0, "window_ms": 1000.0, "burst": 10.0}),
	})
	var r Response
	if err := Decode(msg, &r); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() { _ = Decode(msg, &r) }); n != 0 {
		t.Fatalf("Decode allocates %v times", n)
	}
	descs := []descriptors.Descriptor{{HitsAddend: 1, Entries: []descriptors.Entry{{Key: "a", Value: "b"}}}}
	buf := make([]byte, 0, 256)
	if n := testing.AllocsPerRun(100, func() { buf = AppendRequestFrame(buf[:0], "edge", descs, 1<<40) }); n != 0 {
		t.Fatalf("AppendRequestFrame allocates %v times", n)
	}
}

// FuzzDecode checks that no input makes the decoder panic.
func FuzzDecode(f *testing.F) {
	msg, _ := proto.Marshal(&rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{
			Code: rlsv3.RateLimitResponse_OVER_LIMIT, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 1, Unit: 2, Name: "n"},
			DurationUntilReset: durationpb.New(time.Second),
		}},
		ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "k", Value: "v"}},
		DynamicMetadata: &structpb.Struct{Fields: map[string]*structpb.Value{MetadataKey: structpb.NewListValue(&structpb.ListValue{
			Values: []*structpb.Value{structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"limit": structpb.NewNumberValue(3)}})},
		})}},
	})
	f.Add(msg)
	f.Fuzz(func(t *testing.T, data []byte) {
		var r Response
		_ = Decode(data, &r)
		_, _ = ParseFrame(data)
	})
}

// TestAppendGRPCService checks the GrpcService of proxy_grpc_call against
// the generated type.
func TestAppendGRPCService(t *testing.T) {
	for _, tc := range []struct{ cluster, authority string }{
		{"rls", ""},
		{"sluice_control_plane", "sluice-control-plane.internal"},
		{strings.Repeat("c", 200), strings.Repeat("a", 300)}, // lengths past one varint byte
	} {
		var got corev3.GrpcService
		if err := proto.Unmarshal(AppendGRPCService(nil, tc.cluster, tc.authority), &got); err != nil {
			t.Fatalf("%q: %v", tc.cluster, err)
		}
		want := &corev3.GrpcService{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{
			EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: tc.cluster, Authority: tc.authority}}}
		if !proto.Equal(&got, want) {
			t.Errorf("AppendGRPCService(%q, %q) decodes to %v, want %v", tc.cluster, tc.authority, &got, want)
		}
	}
}
