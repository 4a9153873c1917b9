// Package tracing traces ShouldRateLimit calls with OpenTelemetry, as
// envoyproxy/ratelimit's TRACING_* settings do: one server span per call,
// child of the trace context the caller (Envoy) sent in its W3C
// traceparent / tracestate and baggage headers, exported over OTLP (HTTP or
// gRPC, its endpoint from the standard OTEL_EXPORTER_OTLP_* variables).
//
// A nil *Tracer traces nothing, and the decision port keeps no header for
// it: with tracing off the hot path is unchanged.
package tracing

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/encoding/protowire"
)

// Protocols of Config.Protocol (TRACING_EXPORTER_PROTOCOL).
const (
	ProtocolHTTP = "http"
	ProtocolGRPC = "grpc"
)

// SpanName is the name of each call's span.
const SpanName = "ShouldRateLimit"

// Config configures a Tracer.
type Config struct {
	// Protocol is ProtocolHTTP (OTLP/HTTP protobuf) or ProtocolGRPC.
	Protocol string
	// ServiceName, ServiceNamespace and InstanceID go in the resource
	// (TRACING_SERVICE_NAME, _NAMESPACE, _INSTANCE_ID).
	ServiceName, ServiceNamespace, InstanceID string
	// SamplingRate is the share of new traces sampled, 0 to 1; a call
	// whose caller sampled (or not) follows its caller.
	SamplingRate float64
	// BatchTimeout is how long spans wait to be exported together (0:
	// the SDK's 5 s).
	BatchTimeout time.Duration
}

// Tracer starts the spans of calls.
type Tracer struct {
	provider *sdktrace.TracerProvider
	tracer   trace.Tracer
	prop     propagation.TextMapPropagator
}

// New returns a Tracer exporting with the OTLP exporter cfg.Protocol names;
// the exporter reads its endpoint and options from the environment
// (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, ...).
// Shutdown flushes and stops it.
func New(ctx context.Context, cfg Config) (*Tracer, error) {
	var exp sdktrace.SpanExporter
	var err error
	switch cfg.Protocol {
	case ProtocolHTTP, "":
		exp, err = otlptracehttp.New(ctx)
	case ProtocolGRPC:
		exp, err = otlptracegrpc.New(ctx)
	default:
		return nil, fmt.Errorf("tracing: protocol %q: use http or grpc", cfg.Protocol)
	}
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	if !(cfg.SamplingRate >= 0 && cfg.SamplingRate <= 1) { // NaN too
		return nil, fmt.Errorf("tracing: sampling rate %v: want 0 to 1", cfg.SamplingRate)
	}
	attrs := []attribute.KeyValue{semconv.ServiceName(cfg.ServiceName)}
	if cfg.ServiceNamespace != "" {
		attrs = append(attrs, semconv.ServiceNamespace(cfg.ServiceNamespace))
	}
	if cfg.InstanceID != "" {
		attrs = append(attrs, semconv.ServiceInstanceID(cfg.InstanceID))
	}
	var bopts []sdktrace.BatchSpanProcessorOption
	if cfg.BatchTimeout > 0 {
		bopts = append(bopts, sdktrace.WithBatchTimeout(cfg.BatchTimeout))
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp, bopts...),
		sdktrace.WithResource(resource.NewSchemaless(attrs...)),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.SamplingRate))),
	)
	return &Tracer{
		provider: tp,
		tracer:   tp.Tracer("github.com/sluicehq/sluice/controlplane/internal/tracing"),
		prop:     propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
	}, nil
}

// Shutdown exports the spans still held and stops the Tracer.
func (t *Tracer) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	return t.provider.Shutdown(ctx)
}

// Headers are the request headers the trace context comes in.
func (t *Tracer) Headers() []string {
	if t == nil {
		return nil
	}
	return t.prop.Fields()
}

// Carrier reads request headers for Start; Get returns "" for a missing
// one.
type Carrier interface {
	Get(name string) string
}

// carrier adapts a Carrier to propagation.TextMapCarrier (read only).
type carrier struct{ c Carrier }

func (c carrier) Get(k string) string { return c.c.Get(k) }
func (c carrier) Set(string, string)  {}
func (c carrier) Keys() []string      { return nil }

// Start begins the span of one ShouldRateLimit call whose request message
// is req, under the trace context in headers; call End with the answer.
func (t *Tracer) Start(ctx context.Context, headers Carrier, req []byte) (context.Context, *Span) {
	ctx = t.prop.Extract(ctx, carrier{headers})
	ctx, span := t.tracer.Start(ctx, SpanName, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("rpc.system", "grpc"),
			attribute.String("rpc.service", "envoy.service.ratelimit.v3.RateLimitService"),
			attribute.String("rpc.method", "ShouldRateLimit")))
	if span.IsRecording() {
		domain, n := summarize(req)
		span.SetAttributes(attribute.String("ratelimit.domain", domain), attribute.Int("ratelimit.descriptors", n))
	}
	return ctx, &Span{span}
}

// Span is one call's span.
type Span struct{ s trace.Span }

// overallCodes are RateLimitResponse.Code's names.
var overallCodes = []string{"UNKNOWN", "OK", "OVER_LIMIT"}

// End ends the span with the answer: the response message resp, or err.
func (s *Span) End(resp []byte, err error) {
	if s.s.IsRecording() {
		if err != nil {
			s.s.SetStatus(codes.Error, err.Error())
			s.s.RecordError(err)
		} else {
			code := overallCode(resp)
			name := "UNKNOWN"
			if code >= 0 && code < len(overallCodes) {
				name = overallCodes[code]
			}
			s.s.SetAttributes(attribute.String("ratelimit.overall_code", name))
		}
	}
	s.s.End()
}

// summarize reads a RateLimitRequest's domain (field 1) and counts its
// descriptors (field 2), leniently: a malformed message gives what was read.
func summarize(b []byte) (domain string, descriptors int) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return
		}
		b = b[n:]
		if typ == protowire.BytesType && (num == 1 || num == 2) {
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return
			}
			if num == 1 {
				domain = string(v)
			} else {
				descriptors++
			}
			b = b[m:]
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return
		}
		b = b[m:]
	}
	return
}

// overallCode reads a RateLimitResponse's overall_code (field 1); -1 when
// absent or malformed (absent is UNKNOWN: 0).
func overallCode(b []byte) int {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return -1
		}
		b = b[n:]
		if num == 1 && typ == protowire.VarintType {
			v, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return -1
			}
			return int(v)
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return -1
		}
		b = b[m:]
	}
	return 0
}
