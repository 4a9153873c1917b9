package server

import (
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/sluicehq/sluice/controlplane/internal/connbounds"
	"github.com/sluicehq/sluice/controlplane/internal/grpcunary"
	"github.com/sluicehq/sluice/controlplane/internal/invalidarg"
	"github.com/sluicehq/sluice/controlplane/internal/rls"
)

// streamWindow is the grpc-go decision server's flow-control window per
// stream: the request bytes a stream may have received and not yet read.
// 64 KiB is grpc-go's smallest (it ignores less) and many times a request.
const streamWindow = 64 << 10

// GRPCBounds are the limits of the decision port's grpc-go server, worked
// out from Config.Bounds.
type GRPCBounds struct {
	MaxConns           int           // connections open at once
	StreamsPerConn     uint32        // concurrent streams of one connection
	SharedStreams      int64         // streams beyond each connection's first, server-wide
	MaxMsgBytes        int           // one request message
	MaxHeaderBytes     uint32        // one request's decoded headers
	IdleTimeout        time.Duration // a connection without calls is closed after it
	HandshakeTimeout   time.Duration // preface and SETTINGS must arrive within it
	MaxConnBufferBytes int64         // StreamsPerConn x a stream's bytes
	MaxBufferBytes     int64         // the server-wide bound on buffered request bytes
	FirstCallTimeout   time.Duration // a connection that completed no call is closed after it
	BodyTimeout        time.Duration // a call's request must arrive within it of its headers
}

// grpcBounds works out the grpc-go decision server's limits from cfg's
// bounds. grpc-go cannot count buffered bytes, so the byte budgets become
// stream budgets: a stream may hold its window of unread bytes and the
// message it is assembling (streamWindow + MaxMsgBytes, 128 KiB by
// default), so a connection runs at most MaxConnBufferBytes over that many
// streams (and MaxStreamsPerConn), and the server at most MaxBufferBytes
// over it beyond the first of each connection, which is always admitted so
// that no connection can be starved by others. Buffered request bytes are
// then bounded server-wide by MaxBufferBytes + MaxConns streams.
func grpcBounds(cfg Config) GRPCBounds {
	d := cfg.Bounds.WithDefaults()
	stream := streamWindow + int64(d.MaxMsgBytes)
	b := GRPCBounds{
		MaxConns: d.MaxConns, MaxMsgBytes: d.MaxMsgBytes, MaxHeaderBytes: d.MaxHeaderBytes,
		IdleTimeout: d.IdleTimeout, HandshakeTimeout: d.HandshakeTimeout, FirstCallTimeout: d.FirstCallTimeout, BodyTimeout: d.BodyTimeout,
	}
	b.StreamsPerConn = min(d.MaxStreamsPerConn, uint32(max(1, d.MaxConnBufferBytes/stream)))
	b.SharedStreams = d.MaxBufferBytes / stream
	b.MaxConnBufferBytes = int64(b.StreamsPerConn) * stream
	b.MaxBufferBytes = (b.SharedStreams + int64(b.MaxConns)) * stream
	return b
}

// unaryOptions are the unary decision server's bounds from cfg: the same
// bounds as grpc-go mode's.
func unaryOptions(cfg Config) grpcunary.Options {
	return grpcunary.Options{Bounds: cfg.Bounds.WithDefaults()}
}

// decisionServerOptions are the decision gRPC server's options, tuned for
// many small unary calls and bounded (see grpcBounds): reused stream
// workers, write buffers shared between connections while idle, fixed
// flow-control windows (no BDP probing pings), small messages, a stream
// budget, idle connections closed, and the RLS codec (rls.Codec: requests
// and the responses' dynamic_metadata coded without reflection).
func decisionServerOptions(svc *rls.Service, b GRPCBounds, budget *streamBudget) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.NumStreamWorkers(connbounds.Workers),
		grpc.InitialWindowSize(streamWindow),
		grpc.InitialConnWindowSize(int32(min(max(b.MaxConnBufferBytes, streamWindow), 1<<30))),
		grpc.MaxConcurrentStreams(b.StreamsPerConn),
		grpc.MaxRecvMsgSize(b.MaxMsgBytes),
		grpc.MaxHeaderListSize(b.MaxHeaderBytes),
		grpc.InTapHandle(budget.admit),
		grpc.UnaryInterceptor(budget.requestArrived),
		grpc.StreamInterceptor(budget.requestArrivedStream),
		grpc.ConnectionTimeout(b.HandshakeTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: b.IdleTimeout}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: connbounds.MinPingPeriod, PermitWithoutStream: true}),
		grpc.ForceServerCodecV2(invalidarg.Codec(rls.NewCodec(svc))),
	}
}

// String describes the bounds for the log.
func (b GRPCBounds) String() string {
	return fmt.Sprintf("%d connections (the idlest evicted at the cap), %d streams each, %d more streams shared fairly; buffered requests <= %d KiB a connection, %d MiB in all; requests within %v of their headers; idle connections closed after %v (%v before their first call)",
		b.MaxConns, b.StreamsPerConn, b.SharedStreams, b.MaxConnBufferBytes>>10, b.MaxBufferBytes>>20, b.BodyTimeout, b.IdleTimeout, b.FirstCallTimeout)
}
