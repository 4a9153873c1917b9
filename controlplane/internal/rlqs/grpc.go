package rlqs

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// Bounds of the RLQS listener (ServerConfig's defaults). An Envoy holds one
// connection per replica and one stream per rate_limit_quota filter
// configuration: a connection's first stream is always admitted, and
// DefaultSharedStreams more are shared fairly among the connections. A
// report holds all of a stream's buckets: 128 KiB is 1,024 buckets of ids
// up to about 100 bytes. Each stream may hold a report being received, so
// the reports bound what the streams hold (see MaxBytes).
const (
	DefaultMaxConns      = 1024
	DefaultSharedStreams = 1024
	DefaultMaxStreams    = 16
	DefaultMaxMsgSize    = 128 << 10
	DefaultIdleTimeout   = 5 * time.Minute
	DefaultMinPingPeriod = 10 * time.Second
)

// The RLQS server's flow-control windows (grpc-go's smallest for a stream,
// and a connection's 16 streams' worth) and read buffer.
const (
	streamWindow = 64 << 10
	connWindow   = DefaultMaxStreams * streamWindow
	readBuffer   = 8 << 10
)

// What an RLQS connection and a stream with a report in hold, beyond the
// report being received: TestHostileRLQSStreams measures 31 and 19 KiB;
// rounded up.
const (
	ConnBytes   = 64 << 10
	StreamBytes = 32 << 10
)

// ServerConfig bounds the RLQS gRPC server. Zero values take the defaults.
type ServerConfig struct {
	MaxConns      int           // open connections, for the listener
	SharedStreams int           // streams beyond each connection's first, for the control plane's stream budget
	MaxStreams    uint32        // concurrent streams per connection
	MaxMsgSize    int           // bytes of one message, either way
	IdleTimeout   time.Duration // a connection with no stream this long is closed
	// MinPingPeriod is the shortest keepalive ping period a client may use;
	// a client pinging more often is disconnected.
	MinPingPeriod time.Duration
}

// WithDefaults returns c with its zero fields set to the defaults.
func (c ServerConfig) WithDefaults() ServerConfig {
	if c.MaxConns <= 0 {
		c.MaxConns = DefaultMaxConns
	}
	if c.SharedStreams <= 0 {
		c.SharedStreams = DefaultSharedStreams
	}
	if c.MaxStreams == 0 {
		c.MaxStreams = DefaultMaxStreams
	}
	if c.MaxMsgSize <= 0 {
		c.MaxMsgSize = DefaultMaxMsgSize
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.MinPingPeriod <= 0 {
		c.MinPingPeriod = DefaultMinPingPeriod
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
	return int64(c.MaxConns)*ConnBytes + streams*(StreamBytes+int64(c.MaxMsgSize))
}

// NewGRPCServer returns a grpc-go server serving svc within cfg's bounds
// (but MaxConns and SharedStreams, which the control plane enforces), with
// extra options (it adds its frame guard, stream budget and stream
// interceptor).
func NewGRPCServer(svc *Service, cfg ServerConfig, extra ...grpc.ServerOption) *grpc.Server {
	cfg = cfg.WithDefaults()
	gs := grpc.NewServer(append([]grpc.ServerOption{
		grpc.MaxConcurrentStreams(cfg.MaxStreams),
		// Fixed flow-control windows (no BDP growth, up to 16 MiB a
		// connection): a stream buffers at most its window, or the report
		// it is receiving.
		grpc.InitialWindowSize(streamWindow),
		grpc.InitialConnWindowSize(connWindow),
		// A report every 5 s per stream: a small read buffer (grpc-go
		// returns write buffers to a pool between writes by default).
		grpc.ReadBufferSize(readBuffer),
		grpc.MaxRecvMsgSize(cfg.MaxMsgSize),
		grpc.MaxSendMsgSize(cfg.MaxMsgSize),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: cfg.MinPingPeriod, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: cfg.IdleTimeout, Time: time.Minute, Timeout: 20 * time.Second}),
		grpc.ConnectionTimeout(10 * time.Second),
	}, extra...)...)
	svc.Register(gs)
	return gs
}
