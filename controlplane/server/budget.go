package server

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/sluicehq/sluice/controlplane/invalidarg"
	"github.com/sluicehq/sluice/controlplane/rls"
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
	}
	perConn := orDefault(cfg.MaxConnBufferBytes, DefaultMaxConnBufferBytes)
	total := orDefault(cfg.MaxBufferBytes, DefaultMaxBufferBytes)
	b.StreamsPerConn = min(orDefault(cfg.MaxStreamsPerConn, DefaultMaxStreamsPerConn), uint32(max(1, perConn/grpcStreamBytes)))
	b.SharedStreams = total / grpcStreamBytes
	b.MaxConnBufferBytes = int64(b.StreamsPerConn) * grpcStreamBytes
	b.MaxBufferBytes = (b.SharedStreams + int64(b.MaxConns)) * grpcStreamBytes
	return b
}

// orDefault returns v, or def when v is not positive.
func orDefault[T int | int64 | uint32 | time.Duration](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// streamBudget admits the streams of a grpc-go server (its InTapHandle):
// the first stream of a connection always, the others while the shared
// budget lasts. A refused stream gets RESOURCE_EXHAUSTED and its connection
// goes on. A stream's slot comes back when the stream ends, whichever way
// (grpc-go cancels every stream's context then).
type streamBudget struct {
	free    atomic.Int64  // shared streams left
	refused atomic.Uint64 // streams refused, ever
}

// newStreamBudget returns a budget of shared streams.
func newStreamBudget(shared int64) *streamBudget {
	b := &streamBudget{}
	b.free.Store(shared)
	return b
}

// errBusy refuses a stream over the budget.
var errBusy = status.Error(codes.ResourceExhausted,
	"sluice: too many calls in progress on this server (the decision port's -max-buffer-bytes); retry shortly or on another replica")

// admit is a tap.ServerInHandle.
func (b *streamBudget) admit(ctx context.Context, _ *tap.Info) (context.Context, error) {
	var ca *connAddr
	if p, ok := peer.FromContext(ctx); ok {
		ca, _ = p.Addr.(*connAddr)
	}
	if ca != nil && ca.guaranteed.CompareAndSwap(0, 1) {
		context.AfterFunc(ctx, func() { ca.guaranteed.Store(0) })
		return ctx, nil
	}
	if b.free.Add(-1) < 0 {
		b.free.Add(1)
		b.refused.Add(1)
		return nil, errBusy
	}
	context.AfterFunc(ctx, func() { b.free.Add(1) })
	return ctx, nil
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
		grpc.ConnectionTimeout(b.HandshakeTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: b.IdleTimeout}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.ForceServerCodecV2(invalidarg.Codec(rls.NewCodec(svc))),
	}
}

// String describes the bounds for the log.
func (b Bounds) String() string {
	return fmt.Sprintf("%d connections, %d streams each, %d more streams shared; buffered requests <= %d KiB a connection, %d MiB in all; idle connections closed after %v",
		b.MaxConns, b.StreamsPerConn, b.SharedStreams, b.MaxConnBufferBytes>>10, b.MaxBufferBytes>>20, b.IdleTimeout)
}
