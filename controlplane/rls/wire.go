package rls

import (
	"context"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// ShouldRateLimitWire is ShouldRateLimit on encoded messages, for a server
// that frames gRPC itself (package grpcunary): req is a RateLimitRequest's
// wire bytes, and the result a RateLimitResponse's. It decodes and encodes
// exactly as Codec does on a grpc-go server. A request that does not decode
// is refused with INTERNAL, as grpc-go refuses it.
func (s *Service) ShouldRateLimitWire(ctx context.Context, req []byte) ([]byte, error) {
	r := new(rlsv3.RateLimitRequest)
	if !decodeRequest(req, r) {
		r.Reset()
		if err := proto.Unmarshal(req, r); err != nil {
			return nil, status.Errorf(codes.Internal, "rls: cannot decode the RateLimitRequest: %v", err)
		}
	}
	resp, err := s.ShouldRateLimit(ctx, r)
	if err != nil {
		return nil, err
	}
	if resp.DynamicMetadata == nil {
		return proto.Marshal(resp)
	}
	return marshalResponse(resp, &s.policies.Load().wire)
}
