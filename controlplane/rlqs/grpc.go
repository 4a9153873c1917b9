package rlqs

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// Bounds of the RLQS listener (ServerConfig's defaults). An Envoy holds one
// connection per replica and one stream per rate_limit_quota filter
// configuration, so a few streams per connection and a few thousand
// connections cover large fleets. A report holds all of a stream's
// buckets: 128 KiB is 1,024 buckets of ids up to about 100 bytes. Each
// stream may hold a message being received, so the messages bound what
// the streams hold (see docs/design.md for the figure).
const (
	DefaultMaxConns      = 2048
	DefaultMaxStreams    = 16
	DefaultMaxMsgSize    = 128 << 10
	DefaultIdleTimeout   = 5 * time.Minute
	DefaultMinPingPeriod = 10 * time.Second
)

// ServerConfig bounds the RLQS gRPC server. Zero values take the defaults.
type ServerConfig struct {
	MaxConns    int           // open connections, for the listener (MaxConnsOf)
	MaxStreams  uint32        // concurrent streams per connection
	MaxMsgSize  int           // bytes of one message, either way
	IdleTimeout time.Duration // a connection with no stream this long is closed
	// MinPingPeriod is the shortest keepalive ping period a client may use;
	// a client pinging more often is disconnected.
	MinPingPeriod time.Duration
}

func (c ServerConfig) withDefaults() ServerConfig {
	if c.MaxConns <= 0 {
		c.MaxConns = DefaultMaxConns
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

// NewGRPCServer returns a grpc-go server serving svc within cfg's bounds
// (all but MaxConns, which its listener enforces: see MaxConnsOf), with
// extra options (the control plane adds its frame guard, stream budget and
// stream interceptor).
func NewGRPCServer(svc *Service, cfg ServerConfig, extra ...grpc.ServerOption) *grpc.Server {
	cfg = cfg.withDefaults()
	gs := grpc.NewServer(append([]grpc.ServerOption{
		grpc.MaxConcurrentStreams(cfg.MaxStreams),
		grpc.MaxRecvMsgSize(cfg.MaxMsgSize),
		grpc.MaxSendMsgSize(cfg.MaxMsgSize),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: cfg.MinPingPeriod, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: cfg.IdleTimeout, Time: time.Minute, Timeout: 20 * time.Second}),
		grpc.ConnectionTimeout(10 * time.Second),
	}, extra...)...)
	svc.Register(gs)
	return gs
}

// MaxConnsOf returns the connections cfg allows (the default when unset).
func MaxConnsOf(cfg ServerConfig) int { return cfg.withDefaults().MaxConns }
