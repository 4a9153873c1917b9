package core

import (
	"errors"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/filter/core/rlsproto"
)

// grpcConfig is testConfig with the calls over proxy_grpc_call.
func grpcConfig(failureMode string) string {
	return strings.Replace(withFailureMode(failureMode), `"domain"`, `"transport": "grpc", "domain"`, 1)
}

// receiveGRPC delivers msg, a bare response message, to the last call.
func (b *testbed) receiveGRPC(msg []byte) {
	b.t.Helper()
	a := rlsproto.GRPCMessage(msg, nil)
	if len(msg) > rlsproto.MaxAnswer {
		a = rlsproto.TooLarge(len(msg)) // not read, as a host does
	}
	b.w.Answer(b.lastCall().id, &a)
}

// closeGRPC fails the last call with a gRPC status.
func (b *testbed) closeGRPC(code uint32, message string) {
	b.t.Helper()
	a := rlsproto.GRPCFailure(code, message)
	b.w.Answer(b.lastCall().id, &a)
}

func marshal(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestGRPCTransport(t *testing.T) {
	b := newTestbed(t, grpcConfig("open"))
	id, action := b.request(apiRequest, "10.0.0.9:4242")
	if action != Pause || len(b.host.calls) != 1 {
		t.Fatalf("action %d, %d calls; want a paused request and one call", action, len(b.host.calls))
	}
	c := b.host.calls[0]
	if c.service == nil || c.headers != nil || c.timeout != 25 || c.stream != id {
		t.Fatalf("call %+v: want a gRPC call", c)
	}
	var svc corev3.GrpcService
	if err := proto.Unmarshal(c.service, &svc); err != nil {
		t.Fatal(err)
	}
	if g := svc.GetEnvoyGrpc(); g.GetClusterName() != "sluice_cp" || g.GetAuthority() != "cp.internal" {
		t.Fatalf("grpc service %v", &svc)
	}
	var req rlsv3.RateLimitRequest // the message is bare: the proxy's client frames it
	if err := proto.Unmarshal(c.body, &req); err != nil {
		t.Fatal(err)
	}
	if req.Domain != "edge" || len(req.Descriptors) != 2 || req.Descriptors[1].Entries[0].Value != "k1" {
		t.Fatalf("request %v", &req)
	}
	b.receiveGRPC(marshal(t, &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
			{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: 99, DurationUntilReset: durationpb.New(42 * time.Second)},
			{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: 7, DurationUntilReset: durationpb.New(time.Second)},
		},
		DynamicMetadata: metadata(t,
			map[string]any{"algorithm": "fixed_window", "limit": 100, "window_ms": 60000, "name": "per-ip"},
			map[string]any{"algorithm": "fixed_window", "limit": 10, "window_ms": 1000, "name": "per-key"},
		),
	}))
	if b.host.resumed[id] != 1 || len(b.host.local) != 0 || b.host.counters[MetricAllowed] != 1 {
		t.Fatalf("resumed %d times, local responses %v, counters %v", b.host.resumed[id], b.host.local, b.host.counters)
	}
	b.respond(id)
	want := [][2]string{
		{"ratelimit-policy", `"per-ip";q=100;w=60, "per-key";q=10;w=1`},
		{"ratelimit", `"per-ip";r=99;t=42, "per-key";r=7;t=1`},
	}
	if got := b.host.addedRsp[id]; len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("response headers %v, want %v", got, want)
	}

	// A denial answers 429 and teaches the precheck, as over HTTP.
	id, _ = b.request(apiRequest, "10.0.0.9:4242")
	deny := overLimitAnswer(t, 6000)
	msg, err := rlsproto.ParseFrame(deny.body)
	if err != nil {
		t.Fatal(err)
	}
	b.receiveGRPC(msg)
	if l := b.host.local[id]; l.status != 429 || l.details != DetailsOverLimit {
		t.Fatalf("local response %+v", l)
	}
	calls := len(b.host.calls)
	id, action = b.request(apiRequest, "10.0.0.9:4242")
	if action != Pause || len(b.host.calls) != calls || b.host.local[id].details != DetailsPrecheck {
		t.Fatalf("the precheck did not reject: action %d, %d calls, reply %+v", action, len(b.host.calls)-calls, b.host.local[id])
	}
}

func TestGRPCFailureModes(t *testing.T) {
	tests := []struct {
		name     string
		callErr  error
		code     uint32 // close the call with this status...
		message  string
		answer   []byte // ...or deliver this message
		timedOut bool
	}{
		{name: "call refused", callErr: errors.New("BAD_ARGUMENT")},
		{name: "deadline", code: 4, message: "deadline exceeded", timedOut: true},
		{name: "envoy timeout", code: 14, message: "upstream request timeout", timedOut: true},
		{name: "unavailable", code: 14, message: "no healthy upstream"},
		{name: "internal", code: 13, message: "bad frame"},
		{name: "bad message", answer: []byte{0x08, 0x80}},
		{name: "unknown overall code", answer: marshal(t, &rlsv3.RateLimitResponse{})},
		{name: "too large", answer: make([]byte, rlsproto.MaxAnswer+1)},
	}
	for _, mode := range []string{"open", "closed"} {
		for _, tt := range tests {
			t.Run(mode+"/"+tt.name, func(t *testing.T) {
				b := newTestbed(t, grpcConfig(mode))
				b.host.callErr = tt.callErr
				id, action := b.request(apiRequest, "10.0.0.1:1")
				switch {
				case tt.callErr != nil:
				case tt.answer != nil:
					b.receiveGRPC(tt.answer)
				default:
					b.closeGRPC(tt.code, tt.message)
				}
				if b.host.counters[MetricErrors] != 1 || !b.host.logged("warn: sluice: rate limit check failed, failing "+mode) {
					t.Fatalf("failure not counted or logged: %v %v", b.host.counters, b.host.logs)
				}
				if b.host.logged("raise the plugin's timeout (now 25ms)") != tt.timedOut {
					t.Errorf("timed out %v, but the hint to raise the timeout is there: %v (%v)", tt.timedOut, !tt.timedOut, b.host.logs)
				}
				l, replied := b.host.local[id]
				if mode == "open" {
					if replied || b.host.counters[MetricFailureOpen] != 1 {
						t.Fatalf("failing open replied %+v, counters %v", l, b.host.counters)
					}
					if tt.callErr == nil && b.host.resumed[id] != 1 {
						t.Fatalf("request resumed %d times", b.host.resumed[id])
					}
					if tt.callErr != nil && action != Continue {
						t.Fatalf("action %d, want continue", action)
					}
					return
				}
				if !replied || l.status != 500 || l.details != DetailsFailure || b.host.resumed[id] != 0 {
					t.Fatalf("failing closed: reply %+v, resumed %d, counters %v", l, b.host.resumed[id], b.host.counters)
				}
			})
		}
	}
}

// TestGRPCAnswerAfterGiveUp: an answer to a call the tick gave up on is
// not applied a second time.
func TestGRPCAnswerAfterGiveUp(t *testing.T) {
	b := newTestbed(t, grpcConfig("open"))
	id, _ := b.request(apiRequest, "10.0.0.1:1")
	b.host.now += int64(time.Hour)
	b.runTick()
	if b.host.resumed[id] != 1 || b.host.counters[MetricErrors] != 1 {
		t.Fatalf("tick: resumed %d, counters %v", b.host.resumed[id], b.host.counters)
	}
	b.closeGRPC(4, "deadline exceeded")
	if b.host.resumed[id] != 1 || b.host.counters[MetricErrors] != 1 {
		t.Fatalf("late close applied: resumed %d, counters %v", b.host.resumed[id], b.host.counters)
	}
}
