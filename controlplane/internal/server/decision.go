package server

import (
	"context"
	"log/slog"
	"net"
	"sync"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/controlplane/internal/grpcunary"
	"github.com/sluicehq/sluice/controlplane/internal/rls"
	"github.com/sluicehq/sluice/controlplane/internal/tracing"
)

// decisionServer is what Run needs of the decision port's server; both
// *grpc.Server and *grpcunary.Server have it.
type decisionServer interface {
	Serve(net.Listener) error
	GracefulStop()
	Stop()
}

// Full method names served by the unary server.
var (
	shouldRateLimitMethod = "/" + rlsv3.RateLimitService_ServiceDesc.ServiceName + "/ShouldRateLimit"
	healthCheckMethod     = "/" + healthpb.Health_ServiceDesc.ServiceName + "/Check"
)

// wireCalls are spare slices for the batches of ShouldRateLimit.
var wireCalls = sync.Pool{New: func() any { return new([]rls.WireCall) }}

// newUnaryServer returns the decision port's grpcunary server, bounded by
// opts: the RLS decision, in batches (the calls one connection delivered
// together share one store call), and the health check.
func newUnaryServer(svc *rls.Service, hs *health.Server, opts grpcunary.Options, log *slog.Logger, tr *tracing.Tracer) *unaryServer {
	opts.Logger = log
	opts.KeepHeaders = []string{rls.SettleHeader} // a settlement (sluice's filter)
	if tr != nil {
		opts.KeepHeaders = append(opts.KeepHeaders, tr.Headers()...)
	}
	u := &unaryServer{grpcunary.New(opts)}
	u.HandleBatch(shouldRateLimitMethod, func(ctx context.Context, calls []grpcunary.Call) {
		var spans []*tracing.Span
		if tr != nil {
			spans = make([]*tracing.Span, len(calls))
			for i := range calls {
				_, spans[i] = tr.Start(ctx, headerCarrier(calls[i].Headers), calls[i].Req)
			}
		}
		wc := wireCalls.Get().(*[]rls.WireCall)
		ws := (*wc)[:0]
		for i := range calls {
			ws = append(ws, rls.WireCall{Req: calls[i].Req, Resp: calls[i].Resp, Settle: settleValues(calls[i].Headers)})
		}
		svc.ShouldRateLimitBatch(ctx, ws)
		for i := range calls {
			calls[i].Resp, calls[i].Err = ws[i].Resp, ws[i].Err
		}
		for i, sp := range spans {
			sp.End(calls[i].Resp, calls[i].Err)
		}
		clear(ws)
		*wc = ws[:0]
		wireCalls.Put(wc)
	})
	u.Handle(healthCheckMethod, func(ctx context.Context, req []byte) ([]byte, error) {
		var in healthpb.HealthCheckRequest
		if err := proto.Unmarshal(req, &in); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "cannot decode the HealthCheckRequest: %v", err)
		}
		out, err := hs.Check(ctx, &in)
		if err != nil {
			return nil, err
		}
		return proto.Marshal(out)
	})
	return u
}

// settleValues returns the x-sluice-settle values among the headers
// grpcunary kept: nil when the call is not a settlement.
func settleValues(hs []grpcunary.Header) []string {
	var vs []string
	for _, h := range hs {
		if h.Name == rls.SettleHeader {
			vs = append(vs, h.Value)
		}
	}
	return vs
}

// headerCarrier reads the headers grpcunary kept for tracing.
type headerCarrier []grpcunary.Header

func (h headerCarrier) Get(name string) string {
	for _, f := range h {
		if f.Name == name {
			return f.Value
		}
	}
	return ""
}

// mdCarrier reads grpc-go's incoming metadata for tracing.
type mdCarrier metadata.MD

func (m mdCarrier) Get(name string) string {
	if v := metadata.MD(m).Get(name); len(v) > 0 {
		return v[0]
	}
	return ""
}

// traceInterceptor traces ShouldRateLimit on the grpc-go decision server.
func traceInterceptor(tr *tracing.Tracer) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if info.FullMethod != shouldRateLimitMethod {
			return handler(ctx, req)
		}
		md, _ := metadata.FromIncomingContext(ctx)
		var in []byte
		if m, ok := req.(proto.Message); ok {
			in, _ = proto.Marshal(m)
		}
		ctx, span := tr.Start(ctx, mdCarrier(md), in)
		resp, err := handler(ctx, req)
		var out []byte
		if m, ok := resp.(proto.Message); ok && err == nil {
			out, _ = proto.Marshal(m)
		}
		span.End(out, err)
		return resp, err
	}
}

// unaryServer adapts *grpcunary.Server to decisionServer: Serve's
// ErrServerStopped after a stop is no error, as for grpc-go.
type unaryServer struct{ *grpcunary.Server }

func (u *unaryServer) Serve(ln net.Listener) error {
	if err := u.Server.Serve(ln); err != grpcunary.ErrServerStopped {
		return err
	}
	return nil
}
