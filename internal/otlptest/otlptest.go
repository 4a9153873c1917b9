// Package otlptest is an OpenTelemetry trace receiver for tests: OTLP over
// HTTP (POST /v1/traces, protobuf) or gRPC, on a loopback port, keeping the
// spans it receives.
package otlptest

import (
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// Receiver keeps the spans exported to it.
type Receiver struct {
	coltracepb.UnimplementedTraceServiceServer
	// Addr is its host:port; Endpoint its URL, for
	// OTEL_EXPORTER_OTLP_ENDPOINT.
	Addr, Endpoint string

	mu    sync.Mutex
	spans []*tracepb.Span
}

// Start serves OTLP over protocol ("http" or "grpc") until the test ends.
func Start(t testing.TB, protocol string) *Receiver {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Receiver{Addr: ln.Addr().String(), Endpoint: "http://" + ln.Addr().String()}
	if protocol == "grpc" {
		gs := grpc.NewServer()
		coltracepb.RegisterTraceServiceServer(gs, r)
		go gs.Serve(ln)
		t.Cleanup(gs.Stop)
		return r
	}
	hs := &http.Server{Handler: r, ReadHeaderTimeout: 5 * time.Second}
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })
	return r
}

func (r *Receiver) add(req *coltracepb.ExportTraceServiceRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			r.spans = append(r.spans, ss.GetSpans()...)
		}
	}
}

// Export is the gRPC receiver's method.
func (r *Receiver) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	r.add(req)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// ServeHTTP is the HTTP receiver: POST /v1/traces, protobuf, up to 4 MiB.
func (r *Receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	b, err := io.ReadAll(io.LimitReader(req.Body, 4<<20))
	var in coltracepb.ExportTraceServiceRequest
	if err != nil || req.URL.Path != "/v1/traces" || proto.Unmarshal(b, &in) != nil {
		http.Error(w, "bad export", http.StatusBadRequest)
		return
	}
	r.add(&in)
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(out)
}

// Span returns the span named name in trace, or nil.
func (r *Receiver) Span(name string, trace []byte) *tracepb.Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.spans {
		if s.GetName() == name && string(s.GetTraceId()) == string(trace) {
			return s
		}
	}
	return nil
}
