package stack

import (
	"context"
	"fmt"
	"net"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
)

// FakeRLS is a rate limit service (RLS v3 ShouldRateLimit, grpc-go) whose
// answers a test chooses: what a test of the filter's reading of answers
// the real control plane never gives (gRPC errors of every kind) serves
// Envoy with.
type FakeRLS struct {
	srv *grpc.Server
	ln  net.Listener
}

// RLSAnswer answers one call: a response, or an error (a grpc status
// error gives its code).
type RLSAnswer func(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error)

// StartFakeRLS serves answer on addr ("127.0.0.1:0" picks a free port).
func StartFakeRLS(addr string, answer RLSAnswer) (*FakeRLS, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("fake rls: listen on %s: %w", addr, err)
	}
	f := &FakeRLS{srv: grpc.NewServer(), ln: ln}
	rlsv3.RegisterRateLimitServiceServer(f.srv, fakeRLSServer{answer: answer})
	go f.srv.Serve(ln)
	return f, nil
}

// Addr returns the service's address.
func (f *FakeRLS) Addr() string { return f.ln.Addr().String() }

// Close stops the service.
func (f *FakeRLS) Close() { f.srv.Stop() }

type fakeRLSServer struct {
	rlsv3.UnimplementedRateLimitServiceServer
	answer RLSAnswer
}

func (s fakeRLSServer) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return s.answer(ctx, req)
}
