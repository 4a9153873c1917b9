package server

import (
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/sluicehq/sluice/controlplane/grpcunary"
	"github.com/sluicehq/sluice/controlplane/policystore"
)

// Fixed bounds of the policy and HTTP listeners, which serve operators and
// scrapers, not the fleet.
const (
	policyMaxConns   = 64
	policyMaxStreams = 16 // Apply, Get, List, Delete and Watch
	httpMaxConns     = 64
	httpMaxHeader    = 16 << 10
)

// policyServerOptions bound the policy service's grpc-go server: messages
// the size of the largest policy, fixed windows (no BDP growth), few
// streams per connection, the handshake timeout, and idle connections
// (no call, no Watch) closed.
func policyServerOptions(idle time.Duration) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(policystore.MaxPolicySize + 64<<10),
		grpc.MaxConcurrentStreams(policyMaxStreams),
		grpc.InitialWindowSize(256 << 10),
		grpc.InitialConnWindowSize(1 << 20),
		grpc.MaxHeaderListSize(16 << 10),
		grpc.ConnectionTimeout(DefaultHandshakeTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: idle}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	}
}

// httpServer returns the bounded HTTP server for /metrics and the health
// endpoints: headers within 5 s and 16 KiB, a request within 10 s, idle
// keep-alive connections closed after the idle timeout. Answers must be
// written within 30 s, except with pprof, whose profiles take longer.
func (s *Server) httpServer(h http.Handler) *http.Server {
	hs := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       orDefault(s.cfg.IdleTimeout, DefaultIdleTimeout),
		MaxHeaderBytes:    httpMaxHeader,
		// net/http's own complaints (a bad request line, a failed
		// handshake) go through the throttled log, not straight to stderr.
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	if s.cfg.Pprof {
		hs.WriteTimeout = 0
	}
	return hs
}

// limit caps ln at max connections, with metrics named for the listener.
func (s *Server) limit(ln net.Listener, name string, max int) net.Listener {
	refused := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_connections_refused_total", ConstLabels: prometheus.Labels{"listener": name},
		Help: "Connections closed at once because the listener had its maximum open.",
	})
	l := newLimitListener(ln, max, refused)
	s.registry.MustRegister(refused, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_connections_open", ConstLabels: prometheus.Labels{"listener": name},
		Help: "Connections open on the listener.",
	}, func() float64 { return float64(l.Open()) }))
	return l
}

// registerUnaryStats exposes the unary decision server's connection counts
// under the names the limit listener gives grpc-go mode's (the unary
// server enforces -max-conns itself).
func (s *Server) registerUnaryStats(u *grpcunary.Server) {
	l := prometheus.Labels{"listener": "decision"}
	s.registry.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_connections_refused_total", ConstLabels: l,
			Help: "Connections closed at once because the listener had its maximum open.",
		}, func() float64 { return float64(u.Stats().ConnsRefused) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_connections_evicted_total", ConstLabels: l,
			Help: "Idle connections closed to make room for a new one at the listener's maximum (unary decision server).",
		}, func() float64 { return float64(u.Stats().ConnsEvicted) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_connections_open", ConstLabels: l,
			Help: "Connections open on the listener.",
		}, func() float64 { return float64(u.Stats().ConnsOpen) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_requests_reset_total", ConstLabels: prometheus.Labels{"reason": "body_timeout"},
			Help: "Unfinished decision requests reset: their body was late (-request-body-timeout), or their connection held more than its share of -max-buffer-bytes when another needed room (unary decision server).",
		}, func() float64 { return float64(u.Stats().StreamsTimedOut) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_requests_reset_total", ConstLabels: prometheus.Labels{"reason": "shed"},
			Help: "Unfinished decision requests reset: their body was late (-request-body-timeout), or their connection held more than its share of -max-buffer-bytes when another needed room (unary decision server).",
		}, func() float64 { return float64(u.Stats().StreamsShed) }),
	)
}

// newStreamBudget returns the decision port's stream budget, its refusals
// counted.
func (s *Server) newStreamBudget(shared int64) *streamBudget {
	b := newStreamBudget(shared)
	s.registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "sluice_streams_refused_total",
		Help: "Decision calls refused with RESOURCE_EXHAUSTED because the server-wide stream budget (-max-buffer-bytes) was spent (grpc-go mode).",
	}, func() float64 { return float64(b.refused.Load()) }))
	return b
}
