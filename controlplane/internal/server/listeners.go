package server

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/tap"

	"github.com/sluicehq/sluice/controlplane/internal/connbounds"
	"github.com/sluicehq/sluice/controlplane/internal/grpcunary"
	"github.com/sluicehq/sluice/controlplane/internal/policyservice"
)

// policyServerOptions bound the policy service's grpc-go server: messages
// the size of the largest policy, fixed windows (no BDP growth), few
// streams per connection, the handshake timeout, idle connections (no
// call, no Watch) closed, clients that stop reading closed, and the frame
// guard. auth checks each call's credentials from its tap handle, then svc
// admits Applies and Watches within its limits (policyservice.Limits); the
// tap also marks the calls it lets through on their connection
// (connAddr.begin, end), so that a connection that never made an
// authenticated call is evicted first at the cap and closed after the
// first-call timeout.
func policyServerOptions(auth *policyservice.Authenticator, svc *policyservice.Service, b connbounds.Bounds, creds credentials.TransportCredentials) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.InTapHandle(func(ctx context.Context, info *tap.Info) (context.Context, error) {
			ca := peerConn(ctx)
			if ca != nil {
				ca.tapped.Add(1)
			}
			ctx, err := auth.TapHandle(ctx, info)
			if err == nil {
				ctx, err = svc.TapHandle(ctx, info)
			}
			if err != nil || ca == nil {
				return ctx, err
			}
			ca.begin()
			context.AfterFunc(ctx, func() { ca.end(time.Now()) })
			return ctx, nil
		}),
		grpc.ChainUnaryInterceptor(auth.UnaryInterceptor()),
		grpc.ChainStreamInterceptor(auth.StreamInterceptor()),
		grpc.Creds(creds),
		grpc.MaxRecvMsgSize(b.MaxMsgBytes),
		grpc.MaxConcurrentStreams(b.MaxStreamsPerConn),
		grpc.InitialWindowSize(256 << 10),
		grpc.InitialConnWindowSize(1 << 20),
		grpc.MaxHeaderListSize(b.MaxHeaderBytes),
		grpc.ConnectionTimeout(b.HandshakeTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: b.IdleTimeout, Time: connbounds.KeepaliveTime, Timeout: connbounds.KeepaliveTimeout}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: connbounds.MinPingPeriod, PermitWithoutStream: true}),
	}
}

// HTTP listener bounds beyond connbounds.Operator's.
const (
	// httpWriteTimeout bounds the writing of an answer; pprofWriteTimeout
	// that of a profile or trace, which takes the seconds it is asked for
	// (30 by default) and must fit within it.
	httpWriteTimeout  = 30 * time.Second
	pprofWriteTimeout = 5 * time.Minute
	// httpMaxHeavy bounds the answers other than /healthz and /readyz
	// (/metrics, pprof) in progress at once: the connections that wait on
	// a slow reader for up to the write timeout. The others are idle as
	// soon as their answer is written, so the listener can evict them.
	httpMaxHeavy = connbounds.OperatorMaxConns / 4
)

// httpServer returns the bounded HTTP server for /metrics and the health
// endpoints: headers within 5 s and 16 KiB, a request within 10 s, idle
// keep-alive connections closed after the idle timeout, answers written
// within 30 s (profiles with -pprof: 5 min). Its connections come from an
// evicting limitListener: a connection counts as busy only while a handler
// runs (see trackHTTP), and at most httpMaxHeavy handlers other than the
// probes run at once; a connection whose answer is not out evictGrace
// after its handler ended is evicted first. Clients that never read
// /metrics hold at most httpMaxHeavy connections, and a probe always finds
// one to evict.
func (s *Server) httpServer(h http.Handler) *http.Server {
	hs := &http.Server{
		Handler:           trackHTTP(h, make(chan struct{}, httpMaxHeavy)),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      httpWriteTimeout,
		IdleTimeout:       s.cfg.listenerBounds().IdleTimeout,
		MaxHeaderBytes:    int(connbounds.Default.MaxHeaderBytes),
		ConnState:         httpConnState,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if lc, ok := c.(*limitConn); ok {
				ctx = context.WithValue(ctx, connKey{}, lc.addr)
			}
			return ctx
		},
		// net/http's own complaints (a bad request line, a failed
		// handshake) go through the throttled log, not straight to stderr.
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	if s.cfg.Pprof {
		// pprof's handlers refuse a profile longer than the server's
		// write timeout; the other handlers keep theirs (trackHTTP).
		hs.WriteTimeout = pprofWriteTimeout
	}
	return hs
}

// httpConnState marks an HTTP connection idle once net/http has written
// its answer and waits for another request: it is then evicted by how long
// it has been idle, like the others.
func httpConnState(c net.Conn, st http.ConnState) {
	if lc, ok := c.(*limitConn); ok && st == http.StateIdle {
		lc.addr.lastEnd.Store(time.Now().UnixNano())
		lc.addr.evictFirst.CompareAndSwap(evictAfterGrace, 0)
	}
}

// connKey keys an HTTP request's connection counters in its context.
type connKey struct{}

// isProbe reports whether a request is a health probe: cheap, small and
// never refused.
func isProbe(r *http.Request) bool { return r.URL.Path == "/healthz" || r.URL.Path == "/readyz" }

// trackHTTP marks each request on its connection while h serves it, limits
// the requests other than probes in progress to cap(heavy) (more get 503
// at once, and their connection closes), and gives each answer but a
// profile httpWriteTimeout.
func trackHTTP(h http.Handler, heavy chan struct{}) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ca, _ := r.Context().Value(connKey{}).(*connAddr)
		if ca != nil {
			ca.begin()
			defer func() {
				// The answer is being written; the connection is idle
				// once it is out (httpConnState), unless net/http closes
				// it. Evict it first if it is not out by evictGrace.
				ca.evictFirst.CompareAndSwap(0, evictAfterGrace)
				ca.end(time.Now())
			}()
		}
		if isProbe(r) {
			h.ServeHTTP(w, r)
			return
		}
		select {
		case heavy <- struct{}{}:
			defer func() { <-heavy }()
		default:
			// The connection closes after the answer: a client refused
			// here holds no slot while it waits to retry.
			w.Header().Set("Connection", "close")
			if ca != nil {
				ca.evictFirst.Store(evictNow)
			}
			w.Header().Set("Retry-After", "1")
			http.Error(w, "sluice: too many /metrics and pprof requests in progress; retry shortly", http.StatusServiceUnavailable)
			return
		}
		if !strings.HasPrefix(r.URL.Path, "/debug/pprof/") {
			http.NewResponseController(w).SetWriteDeadline(time.Now().Add(httpWriteTimeout))
		}
		h.ServeHTTP(w, r)
	})
}

// limit caps ln at max connections, with metrics named for the listener.
func (s *Server) limit(ln net.Listener, name string, max int) *limitListener {
	refused := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_connections_refused_total", ConstLabels: prometheus.Labels{"listener": name},
		Help: refusedHelp,
	})
	l := newLimitListener(ln, max, refused)
	s.registry.MustRegister(refused, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_connections_open", ConstLabels: prometheus.Labels{"listener": name},
		Help: openHelp,
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
			Help: refusedHelp,
		}, func() float64 { return float64(u.Stats().ConnsRefused) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_connections_evicted_total", ConstLabels: l,
			Help: evictedHelp,
		}, func() float64 { return float64(u.Stats().ConnsEvicted) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_connections_open", ConstLabels: l,
			Help: openHelp,
		}, func() float64 { return float64(u.Stats().ConnsOpen) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_requests_reset_total", ConstLabels: prometheus.Labels{"reason": "body_timeout"},
			Help: resetHelp,
		}, func() float64 { return float64(u.Stats().StreamsTimedOut) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_requests_reset_total", ConstLabels: prometheus.Labels{"reason": "shed"},
			Help: resetHelp,
		}, func() float64 { return float64(u.Stats().StreamsShed) }),
	)
}

// The helps of the metrics registered more than once (for each listener,
// or each reason), one for every registration: a registry refuses two
// helps for one name.
const (
	refusedHelp = "Connections closed at once because the listener had its maximum open (and, where it evicts, all of them busy)."
	openHelp    = "Connections open on the listener."
	evictedHelp = "Connections closed to make room for a new one at the listener's maximum: the one without calls in flight due to close soonest for want of calls."
	resetHelp   = "Unfinished decision requests reset: their body was late (-request-body-timeout), or their connection held more than its share of -max-buffer-bytes when another needed room (unary decision server)."
)

// evicting makes l evict at its cap (see limitListener.evictAtCap), with
// the listener's metric of evictions.
func (s *Server) evicting(l *limitListener, name string, idle, firstCall time.Duration) *limitListener {
	evicted := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_connections_evicted_total", ConstLabels: prometheus.Labels{"listener": name},
		Help: evictedHelp,
	})
	s.registry.MustRegister(evicted)
	l.evictAtCap(idle, firstCall, evicted)
	return l
}

// guard returns creds (nil: cleartext) wrapped in the frame guard, with
// the listener's metric of connections it ended.
func (s *Server) guard(creds credentials.TransportCredentials, name string) credentials.TransportCredentials {
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	calms := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_connections_calmed_total", ConstLabels: prometheus.Labels{"listener": name},
		Help: "Connections told GOAWAY ENHANCE_YOUR_CALM and closed for flooding resets, refused streams, SETTINGS, CONTINUATION or PING frames (grpc-go servers).",
	})
	s.registry.MustRegister(calms)
	return guardCreds{creds, calms}
}

// newStreamBudget returns the decision port's stream budget, its refusals
// counted.
func (s *Server) newStreamBudget(shared int64, bodyTimeout time.Duration) *streamBudget {
	b := newStreamBudget(shared, bodyTimeout)
	s.registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "sluice_streams_refused_total",
		Help: "Decision calls refused with RESOURCE_EXHAUSTED because the server-wide stream budget (-max-buffer-bytes) was spent (grpc-go mode).",
	}, func() float64 { return float64(b.refused.Load()) }), prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "sluice_streams_preempted_total",
		Help: "Decision calls still waiting for their request cancelled to give their stream to a connection under its fair share of -max-buffer-bytes (grpc-go mode).",
	}, func() float64 { return float64(b.preempted.Load()) }), prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "sluice_streams_body_timeouts_total",
		Help: "Decision calls reset because their request had not arrived -request-body-timeout after their headers (grpc-go mode).",
	}, func() float64 { return float64(b.late.Load()) }))
	return b
}
