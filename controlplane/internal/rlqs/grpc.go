package rlqs

import (
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/sluicehq/sluice/controlplane/internal/connbounds"
)

// DefaultSharedStreams is how many streams beyond each connection's first
// (always admitted) the connections share fairly.
const DefaultSharedStreams = 1024

// The RLQS server's flow-control windows (grpc-go's smallest for a stream,
// and a connection's streams' worth) and read buffer.
const (
	streamWindow = 64 << 10
	connWindow   = connbounds.RLQSMaxStreams * streamWindow
	readBuffer   = 8 << 10
)

// What an RLQS connection and a stream with a report in hold, beyond the
// report being received: TestHostileRLQSStreams measures 31 and 19 KiB;
// rounded up.
const (
	ConnBytes   = 64 << 10
	StreamBytes = 32 << 10
)

// ServerConfig bounds the RLQS gRPC server. Zero values take the defaults:
// connbounds.Default.RLQS() and DefaultSharedStreams.
type ServerConfig struct {
	// Bounds: MaxConns is the listener's (the control plane enforces it),
	// MaxStreamsPerConn, MaxMsgBytes (either way), MaxHeaderBytes,
	// HandshakeTimeout and IdleTimeout (a connection with no stream this
	// long is closed) the gRPC server's.
	connbounds.Bounds
	// SharedStreams are the streams beyond each connection's first, for
	// the control plane's stream budget.
	SharedStreams int
}

// WithDefaults returns c with its zero fields set to the defaults.
func (c ServerConfig) WithDefaults() ServerConfig {
	c.Bounds = c.Bounds.Or(connbounds.Default.RLQS())
	if c.SharedStreams <= 0 {
		c.SharedStreams = DefaultSharedStreams
	}
	return c
}

// MaxBytes returns the most the listener's connections and streams hold
// when the control plane enforces c (connections and shared streams): a
// stream per connection and the shared ones, each with a report being
// received. The defaults' figure: 1,024 x 64 KiB + 2,048 x (32 + 128) KiB
// = 384 MiB.
func (c ServerConfig) MaxBytes() int64 {
	c = c.WithDefaults()
	streams := int64(c.MaxConns + c.SharedStreams)
	return int64(c.MaxConns)*ConnBytes + streams*(StreamBytes+int64(c.MaxMsgBytes))
}

// NewGRPCServer returns a grpc-go server serving svc within cfg's bounds
// (but MaxConns and SharedStreams, which the control plane enforces), with
// extra options (it adds its frame guard, stream budget and stream
// interceptor).
func NewGRPCServer(svc *Service, cfg ServerConfig, extra ...grpc.ServerOption) *grpc.Server {
	cfg = cfg.WithDefaults()
	gs := grpc.NewServer(append([]grpc.ServerOption{
		grpc.MaxConcurrentStreams(cfg.MaxStreamsPerConn),
		// Fixed flow-control windows (no BDP growth, up to 16 MiB a
		// connection): a stream buffers at most its window, or the report
		// it is receiving.
		grpc.InitialWindowSize(streamWindow),
		grpc.InitialConnWindowSize(connWindow),
		// A report every 5 s per stream: a small read buffer (grpc-go
		// returns write buffers to a pool between writes by default).
		grpc.ReadBufferSize(readBuffer),
		grpc.MaxRecvMsgSize(cfg.MaxMsgBytes),
		grpc.MaxSendMsgSize(cfg.MaxMsgBytes),
		grpc.MaxHeaderListSize(cfg.MaxHeaderBytes),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: connbounds.MinPingPeriod, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: cfg.IdleTimeout, Time: connbounds.KeepaliveTime, Timeout: connbounds.KeepaliveTimeout}),
		grpc.ConnectionTimeout(cfg.HandshakeTimeout),
	}, extra...)...)
	svc.Register(gs)
	return gs
}
