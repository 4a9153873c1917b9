package rls

import (
	"context"
	"sync"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// arenas are the arenas of wire calls in progress and spare.
var arenas = sync.Pool{New: func() any { return new(arena) }}

// ShouldRateLimitWire is ShouldRateLimit on encoded messages, for a server
// that frames gRPC itself (package grpcunary): req is a RateLimitRequest's
// wire bytes, and the RateLimitResponse's are appended to dst. It decodes
// and encodes exactly as Codec does on a grpc-go server, with the request's
// messages in a pooled arena. A request that does not decode is refused
// with INTERNAL, as grpc-go refuses it.
func (s *Service) ShouldRateLimitWire(ctx context.Context, dst, req []byte) ([]byte, error) {
	a := arenas.Get().(*arena)
	defer func() {
		a.reset()
		arenas.Put(a)
	}()
	r := a.request()
	if !decodeRequestIn(req, r, a) {
		r = new(rlsv3.RateLimitRequest)
		if err := proto.Unmarshal(req, r); err != nil {
			return nil, status.Errorf(codes.Internal, "rls: cannot decode the RateLimitRequest: %v", err)
		}
	}
	resp, err := s.ShouldRateLimit(ctx, r)
	if err != nil {
		return nil, err
	}
	if resp.DynamicMetadata == nil {
		return proto.MarshalOptions{}.MarshalAppend(dst, resp)
	}
	return appendResponse(dst, resp, &s.policies.Load().wire)
}
