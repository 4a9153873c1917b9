package host

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// TestCallerSpeaksGRPC checks the proxy_http_call transport against a real
// grpc-go server (what the control plane runs): a hand-framed unary call
// over h2c gets the framed reply and grpc-status in the trailers.
func TestCallerSpeaksGRPC(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)

	c := newCaller(map[string]string{"cp": lis.Addr().String()}, 1<<20, CallFailureEnvoy)
	defer c.close()
	headers := Headers{
		{":method", "POST"}, {":path", "/grpc.health.v1.Health/Check"}, {":authority", "cp"},
		{"content-type", "application/grpc"}, {"te", "trailers"},
	}
	// An empty HealthCheckRequest: flag 0, length 0.
	resp := c.do(context.Background(), lis.Addr().String(), headers, []byte{0, 0, 0, 0, 0}, nil, 5*time.Second)
	if s, _ := resp.headers.Get(":status"); s != "200" {
		t.Fatalf("headers %q", resp.headers)
	}
	if g, _ := resp.trailers.Get("grpc-status"); g != "0" {
		t.Fatalf("trailers %q, want grpc-status 0", resp.trailers)
	}
	// HealthCheckResponse{status: SERVING}: field 1 varint 1.
	want := []byte{0, 0, 0, 0, 2, 0x08, 0x01}
	if string(resp.body) != string(want) {
		t.Fatalf("body %v, want %v", resp.body, want)
	}

	// An unknown method: the status comes back in the headers
	// (trailers-only), as a filter must also handle.
	headers[1][1] = "/no.Such/Method"
	resp = c.do(context.Background(), lis.Addr().String(), headers, []byte{0, 0, 0, 0, 0}, nil, 5*time.Second)
	g, inHeaders := resp.headers.Get("grpc-status")
	if !inHeaders {
		g, _ = resp.trailers.Get("grpc-status")
	}
	if g != "12" {
		t.Fatalf("grpc-status %q (headers %q trailers %q), want 12 UNIMPLEMENTED", g, resp.headers, resp.trailers)
	}
}
