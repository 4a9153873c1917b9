package server

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

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

// orDefault returns v, or def when v is not positive.
func orDefault[T int | int64 | uint32 | time.Duration](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// streamBudget admits the streams of a grpc-go server (its InTapHandle):
// the first stream of a connection always, the others from a shared budget
// while the connection holds fewer of its streams than are left free (see
// fairShare). A refused stream gets RESOURCE_EXHAUSTED and its connection
// goes on. A stream's slot comes back when the stream ends, whichever way
// (grpc-go cancels every stream's context then).
//
// It also marks the calls on their connection (connAddr.begin and end:
// the listener evicts idle connections by them), and gives each admitted
// call bodyTimeout to deliver its request (see bodyDeadline).
type streamBudget struct {
	free        atomic.Int64  // shared streams left
	refused     atomic.Uint64 // streams refused, ever
	bodyTimeout time.Duration // 0: none
	now         func() time.Time
}

// newStreamBudget returns a budget of shared streams whose calls must
// deliver their request within bodyTimeout (0: no limit).
func newStreamBudget(shared int64, bodyTimeout time.Duration) *streamBudget {
	b := &streamBudget{bodyTimeout: bodyTimeout, now: time.Now}
	b.free.Store(shared)
	return b
}

// fairShare reports whether a connection that holds held shared streams
// may take one more when free are left: while it holds fewer than are
// free. Connections that all want more settle at shared/(n+1) each and
// leave as many free for any connection that holds fewer, so no
// connection takes more than its share while others wait, and one that
// holds nothing gets a slot whenever any is free.
func fairShare(free, held int64) bool { return free > held }

// errBusy refuses a stream over the budget.
var errBusy = status.Error(codes.ResourceExhausted,
	"sluice: too many calls in progress on this server (the decision port's -max-buffer-bytes); retry shortly or on another replica")

// admit is a tap.ServerInHandle.
func (b *streamBudget) admit(ctx context.Context, _ *tap.Info) (context.Context, error) {
	ca := peerConn(ctx)
	if ca == nil { // not from a limitListener: the shared budget alone
		if !b.take(&connAddr{}) {
			return nil, errBusy
		}
		context.AfterFunc(ctx, func() { b.free.Add(1) })
		return b.bodyDeadline(ctx), nil
	}
	ca.tapped.Add(1)
	release := func() { ca.guaranteed.Store(0) }
	if !ca.guaranteed.CompareAndSwap(0, 1) {
		if !b.take(ca) {
			ca.lastEnd.Store(b.now().UnixNano()) // the connection is in use
			return nil, errBusy
		}
		release = func() { ca.held.Add(-1); b.free.Add(1) }
	}
	ca.begin()
	context.AfterFunc(ctx, func() { release(); ca.end(b.now()) })
	return b.bodyDeadline(ctx), nil
}

// take takes a shared stream for ca if fairShare allows, or counts a
// refusal.
func (b *streamBudget) take(ca *connAddr) bool {
	for {
		free := b.free.Load()
		if !fairShare(free, ca.held.Load()) {
			b.refused.Add(1)
			return false
		}
		if b.free.CompareAndSwap(free, free-1) {
			ca.held.Add(1)
			return true
		}
	}
}

// peerConn returns the connection counters of a call's peer, or nil.
func peerConn(ctx context.Context) *connAddr {
	if p, ok := peer.FromContext(ctx); ok {
		ca, _ := p.Addr.(*connAddr)
		return ca
	}
	return nil
}

// bodyKey keys the timer of bodyDeadline in a call's context.
type bodyKey struct{}

// errBodyTimeout ends a call whose request did not arrive in time.
var errBodyTimeout = errors.New("sluice: the request did not arrive within -body-timeout of its headers")

// bodyDeadline returns ctx, cancelled bodyTimeout from now unless
// requestArrived stops it first: a call whose request never ends is then
// reset (grpc-go ends a stream whose context ends) and the bytes it holds
// freed, where it would otherwise hold its stream until the idle timeout.
func (b *streamBudget) bodyDeadline(ctx context.Context) context.Context {
	if b.bodyTimeout <= 0 {
		return ctx
	}
	ctx, cancel := context.WithCancelCause(ctx)
	t := time.AfterFunc(b.bodyTimeout, func() { cancel(errBodyTimeout) })
	return context.WithValue(ctx, bodyKey{}, t)
}

// requestArrived is a unary interceptor: grpc-go runs it once the request
// has been read, so it stops the body deadline.
func requestArrived(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if t, ok := ctx.Value(bodyKey{}).(*time.Timer); ok {
		t.Stop()
	}
	return handler(ctx, req)
}

// requestArrivedStream is requestArrived for streaming calls (the health
// service's Watch): the deadline stops at the first message received.
func requestArrivedStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if t, ok := ss.Context().Value(bodyKey{}).(*time.Timer); ok {
		return handler(srv, &firstRecv{ServerStream: ss, t: t})
	}
	return handler(srv, ss)
}

// firstRecv stops a body deadline when its stream's first message is in.
type firstRecv struct {
	grpc.ServerStream
	t *time.Timer
}

func (s *firstRecv) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	s.t.Stop()
	return err
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
		grpc.UnaryInterceptor(requestArrived),
		grpc.StreamInterceptor(requestArrivedStream),
		grpc.ConnectionTimeout(b.HandshakeTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: b.IdleTimeout}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.ForceServerCodecV2(rls.NewCodec(svc)),
	}
}

// String describes the bounds for the log.
func (b Bounds) String() string {
	return fmt.Sprintf("%d connections (the idlest evicted at the cap), %d streams each, %d more streams shared fairly; buffered requests <= %d KiB a connection, %d MiB in all; requests within %v of their headers; idle connections closed after %v (%v before their first call)",
		b.MaxConns, b.StreamsPerConn, b.SharedStreams, b.MaxConnBufferBytes>>10, b.MaxBufferBytes>>20, b.BodyTimeout, b.IdleTimeout, b.FirstCallTimeout)
}
