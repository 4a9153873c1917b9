package server

import (
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/sluicehq/sluice/controlplane/internal/grpcunary"
	"github.com/sluicehq/sluice/controlplane/internal/invalidarg"
	"github.com/sluicehq/sluice/controlplane/internal/rls"
)

// Defaults of the decision port's bounds (Config.MaxConns and the rest;
// the flags of the same names).
const (
	// DefaultMaxConns caps the decision port's open connections. Envoy
	// opens one per worker thread and control-plane replica.
	DefaultMaxConns = 1024
	// DefaultMaxStreamsPerConn is the SETTINGS_MAX_CONCURRENT_STREAMS of a
	// connection: a decision takes a millisecond or two, so 100 in flight
	// on one connection is tens of thousands of decisions a second.
	DefaultMaxStreamsPerConn = 100
	// DefaultMaxConnBufferBytes bounds the request bytes one connection
	// may have buffered.
	DefaultMaxConnBufferBytes = 4 << 20
	// DefaultMaxBufferBytes bounds the request bytes buffered by all the
	// connections of the decision port together.
	DefaultMaxBufferBytes = 64 << 20
	// DefaultIdleTimeout closes a connection without calls for this long.
	DefaultIdleTimeout = 5 * time.Minute
	// DefaultFirstCallTimeout closes a connection that has completed no
	// call for this long after it was accepted (decision port in grpc-go
	// mode, policy service): a client connects because it has a call to
	// make, and a connection that makes none only holds a slot.
	DefaultFirstCallTimeout = 10 * time.Second
	// DefaultBodyTimeout resets a grpc-go decision call whose request has
	// not arrived this long after its headers. Decision requests are a few
	// hundred bytes, sent with their headers; Envoy gives up on a call
	// after 20 ms by default. 2 s leaves room for a lost packet's
	// retransmissions (200 ms, 400 ms, 800 ms) on a slow network.
	DefaultBodyTimeout = 2 * time.Second
	// DefaultHandshakeTimeout bounds a new connection's way to its first
	// call: the HTTP/2 preface and SETTINGS (and TLS on the policy port).
	DefaultHandshakeTimeout = 10 * time.Second
	// MaxRequestBytes bounds one decision request message in grpc-go mode.
	// Requests are a few hundred bytes; 256 descriptors of 60 bytes fit.
	MaxRequestBytes = 16 << 10
)

// streamWindow is the grpc-go decision server's flow-control window per
// stream: the request bytes a stream may have received and not yet read.
// 64 KiB is grpc-go's smallest (it ignores less) and many times a request.
const streamWindow = 64 << 10

// grpcStreamBytes is what one grpc-go stream may buffer: its window of
// unread bytes and the message it is assembling.
const grpcStreamBytes = streamWindow + MaxRequestBytes

// streamWorkers is how many goroutines the decision gRPC server keeps to
// run calls: a call whose handler waits on Redis holds one, and a call that
// finds them all busy gets a goroutine of its own, as without workers. The
// workers keep their grown stacks, where a fresh goroutine per call would
// grow (copy) its stack on every call.
const streamWorkers = 256

// Bounds are the limits of the decision port's grpc-go server, worked out
// from Config.
type Bounds struct {
	MaxConns           int           // connections open at once
	StreamsPerConn     uint32        // concurrent streams of one connection
	SharedStreams      int64         // streams beyond each connection's first, server-wide
	IdleTimeout        time.Duration // a connection without calls is closed after it
	HandshakeTimeout   time.Duration // preface and SETTINGS must arrive within it
	MaxConnBufferBytes int64         // StreamsPerConn x grpcStreamBytes
	MaxBufferBytes     int64         // the server-wide bound on buffered request bytes
	FirstCallTimeout   time.Duration // a connection that completed no call is closed after it
	BodyTimeout        time.Duration // a call's request must arrive within it of its headers
}

// grpcBounds works out the grpc-go decision server's limits from cfg. grpc-go
// cannot count buffered bytes, so the byte budgets become stream budgets: a
// stream may hold grpcStreamBytes (80 KiB) of request data, so a connection
// runs at most MaxConnBufferBytes/80 KiB streams (and MaxStreamsPerConn),
// and the server at most MaxBufferBytes/80 KiB streams beyond the first of
// each connection, which is always admitted so that no connection can be
// starved by others. Buffered request bytes are then bounded server-wide by
// MaxBufferBytes + MaxConns x 80 KiB.
func grpcBounds(cfg Config) Bounds {
	b := Bounds{
		MaxConns:         orDefault(cfg.MaxConns, DefaultMaxConns),
		IdleTimeout:      orDefault(cfg.IdleTimeout, DefaultIdleTimeout),
		HandshakeTimeout: DefaultHandshakeTimeout,
		FirstCallTimeout: firstCallTimeout(cfg),
		BodyTimeout:      orDefault(cfg.BodyTimeout, DefaultBodyTimeout),
	}
	perConn := orDefault(cfg.MaxConnBufferBytes, DefaultMaxConnBufferBytes)
	total := orDefault(cfg.MaxBufferBytes, DefaultMaxBufferBytes)
	b.StreamsPerConn = min(orDefault(cfg.MaxStreamsPerConn, DefaultMaxStreamsPerConn), uint32(max(1, perConn/grpcStreamBytes)))
	b.SharedStreams = total / grpcStreamBytes
	b.MaxConnBufferBytes = int64(b.StreamsPerConn) * grpcStreamBytes
	b.MaxBufferBytes = (b.SharedStreams + int64(b.MaxConns)) * grpcStreamBytes
	return b
}

// unaryOptions are the unary decision server's bounds from cfg: the same
// fields bound the decision port in both server modes. Zero fields take
// grpcunary's defaults.
func unaryOptions(cfg Config) grpcunary.Options {
	return grpcunary.Options{
		MaxConns: cfg.MaxConns, MaxConcurrentStreams: cfg.MaxStreamsPerConn, MaxRecvMsgSize: cfg.MaxRecvMsgSize,
		MaxConnBufferBytes: cfg.MaxConnBufferBytes, MaxBufferBytes: cfg.MaxBufferBytes, IdleTimeout: cfg.IdleTimeout,
		FirstCallTimeout: cfg.FirstCallTimeout, RequestBodyTimeout: cfg.BodyTimeout,
	}
}

// orDefault returns v, or def when v is not positive.
func orDefault[T int | int64 | uint32 | time.Duration](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// decisionServerOptions are the decision gRPC server's options, tuned for
// many small unary calls and bounded (see grpcBounds): reused stream
// workers, write buffers shared between connections while idle, fixed
// flow-control windows (no BDP probing pings), small messages, a stream
// budget, idle connections closed, and the RLS codec (rls.Codec: requests
// and the responses' dynamic_metadata coded without reflection).
func decisionServerOptions(svc *rls.Service, b Bounds, budget *streamBudget) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.NumStreamWorkers(streamWorkers),
		grpc.InitialWindowSize(streamWindow),
		grpc.InitialConnWindowSize(int32(min(max(b.MaxConnBufferBytes, streamWindow), 1<<30))),
		grpc.MaxConcurrentStreams(b.StreamsPerConn),
		grpc.MaxRecvMsgSize(MaxRequestBytes),
		grpc.MaxHeaderListSize(16 << 10),
		grpc.InTapHandle(budget.admit),
		grpc.UnaryInterceptor(budget.requestArrived),
		grpc.StreamInterceptor(budget.requestArrivedStream),
		grpc.ConnectionTimeout(b.HandshakeTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: b.IdleTimeout}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.ForceServerCodecV2(invalidarg.Codec(rls.NewCodec(svc))),
	}
}

// String describes the bounds for the log.
func (b Bounds) String() string {
	return fmt.Sprintf("%d connections (the idlest evicted at the cap), %d streams each, %d more streams shared fairly; buffered requests <= %d KiB a connection, %d MiB in all; requests within %v of their headers; idle connections closed after %v (%v before their first call)",
		b.MaxConns, b.StreamsPerConn, b.SharedStreams, b.MaxConnBufferBytes>>10, b.MaxBufferBytes>>20, b.BodyTimeout, b.IdleTimeout, b.FirstCallTimeout)
}
