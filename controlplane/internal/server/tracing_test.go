package server

import (
	"context"
	"fmt"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc/metadata"

	"github.com/sluicehq/sluice/controlplane/internal/tracing"
	"github.com/sluicehq/sluice/internal/otlptest"
)

// TestTracing: on both decision servers, each ShouldRateLimit is a server
// span under the traceparent the caller sent, with the domain and the
// answer.
func TestTracing(t *testing.T) {
	for _, kind := range DecisionServers {
		t.Run(kind, func(t *testing.T) {
			rcv := otlptest.Start(t, "http")
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.Endpoint)
			tr, err := tracing.New(context.Background(), tracing.Config{Protocol: tracing.ProtocolHTTP, ServiceName: "sluice-test",
				SamplingRate: 1, BatchTimeout: 50 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Shutdown(context.Background())
			srv := start(t, Config{Policies: policies(t), GRPCServer: kind, Tracer: tr})
			c := rlsv3.NewRateLimitServiceClient(dial(t, srv.GRPCAddr()))
			trace := []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, byte(len(kind))}
			parent := []byte{8, 7, 6, 5, 4, 3, 2, 1}
			ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", fmt.Sprintf("00-%x-%x-01", trace, parent))
			for range 3 {
				if _, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "srv", Descriptors: []*ratelimitv3.RateLimitDescriptor{
					{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "alice"}}}}}); err != nil {
					t.Fatal(err)
				}
			}
			var s *tracepb.Span
			waitUntil(t, "the span exported", 20*time.Second, func() bool {
				s = rcv.Span(tracing.SpanName, trace)
				return s != nil
			})
			attrs := map[string]string{}
			for _, a := range s.GetAttributes() {
				attrs[a.GetKey()] = a.GetValue().GetStringValue()
			}
			if string(s.GetParentSpanId()) != string(parent) || s.GetKind() != tracepb.Span_SPAN_KIND_SERVER || attrs["ratelimit.domain"] != "srv" {
				t.Errorf("span: parent %x kind %v attributes %v", s.GetParentSpanId(), s.GetKind(), attrs)
			}
		})
	}
}
