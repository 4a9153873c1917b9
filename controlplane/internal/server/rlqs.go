package server

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/controlplane/internal/rlqs"
)

// rlqsPart is Envoy's Rate Limit Quota Service on its own listener (off
// unless Config.RLQSAddr is set).
type rlqsPart struct {
	svc  *rlqs.Service
	grpc *grpc.Server
	ln   net.Listener
}

// errRLQSBusy refuses an RLQS stream over the server's stream budget.
var errRLQSBusy = status.Error(codes.ResourceExhausted,
	"sluice: too many RLQS streams on this server; retry shortly or on another replica")

// errStreamIdle ends an RLQS stream that sent no report for the idle
// timeout (Envoy reports every 5 s).
var errStreamIdle = errors.New("sluice: no RLQS report for the idle timeout")

// buildRLQS makes the RLQS service and opens its listener, when asked for:
// bounded like the policy service's (connections evicted at the cap, the
// frame guard) and the decision port's in grpc-go mode (a stream budget
// shared fairly by connection).
func (s *Server) buildRLQS() error {
	if s.cfg.RLQSAddr == "" {
		return nil
	}
	opts := s.cfg.RLQS
	opts.Logger, opts.Registerer = s.log, s.registry
	if s.client != nil {
		opts.Demand = rlqs.NewRedisDemand(s.client)
	}
	svc, err := rlqs.New(s.store, s.policies.Current().Set, opts)
	if err != nil {
		return fmt.Errorf("server: %w", err)
	}
	ln, err := net.Listen("tcp", s.cfg.RLQSAddr)
	if err != nil {
		return fmt.Errorf("server: RLQS address %s: %w", s.cfg.RLQSAddr, err)
	}
	sc := s.cfg.RLQSServer
	sc.Bounds = sc.Bounds.Or(s.cfg.listenerBounds().RLQS())
	sc = sc.WithDefaults()
	firstCall := sc.FirstCallTimeout
	budget := s.rlqsStreamBudget(int64(sc.SharedStreams), firstCall)
	gs := rlqs.NewGRPCServer(svc, sc,
		grpc.Creds(s.guard(nil, "rlqs")),
		grpc.InTapHandle(budget.admit),
		grpc.StreamInterceptor(rlqsActivity(budget, sc.IdleTimeout)))
	lim := s.evicting(s.limit(ln, "rlqs", sc.MaxConns), "rlqs", sc.IdleTimeout, firstCall)
	s.rlqs = &rlqsPart{svc: svc, grpc: gs, ln: lim}
	return nil
}

// rlqsStreamBudget returns the RLQS listener's stream budget: a
// connection's first stream always, shared more shared fairly, each
// stream's first report within firstCall; its refusals counted.
func (s *Server) rlqsStreamBudget(shared int64, firstCall time.Duration) *streamBudget {
	b := newStreamBudget(shared, firstCall)
	b.streaming, b.busy = true, errRLQSBusy
	s.registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "sluice_rlqs_streams_refused_total",
		Help: "RLQS streams refused with RESOURCE_EXHAUSTED: their connection had its first stream and its share of the streams shared by all.",
	}, func() float64 { return float64(b.refused.Load()) }), prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "sluice_rlqs_streams_reset_total",
		Help: "RLQS streams reset before their first report: it was late (-first-call-timeout), or their connection held more than its share of streams when another needed one.",
	}, func() float64 { return float64(b.late.Load() + b.preempted.Load()) }))
	return b
}

// rlqsActivity is the RLQS listener's stream interceptor: each report
// marks its connection active (the listener evicts the connection whose
// last report is oldest, and closes one that sent none within the first
// call timeout), the first ends the stream's first-report deadline, and a
// stream that sends no report for idle is ended.
func rlqsActivity(b *streamBudget, idle time.Duration) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		c, _ := ss.Context().Value(callKey{}).(*call)
		if c == nil {
			return handler(srv, ss)
		}
		quiet := time.AfterFunc(idle, func() { c.cancel(errStreamIdle) })
		defer quiet.Stop()
		// grpc-go lets one goroutine at a time receive on a stream.
		return handler(srv, &afterRecv{ServerStream: ss, f: func(err error) {
			if err == nil {
				b.arrived(c)
				c.ca.lastEnd.Store(b.now().UnixNano())
				quiet.Reset(idle)
			}
		}})
	}
}

// RLQSAddr returns the RLQS listener's address, or "" when it is off.
func (s *Server) RLQSAddr() string {
	if s.rlqs == nil {
		return ""
	}
	return s.rlqs.ln.Addr().String()
}

// serveRLQS serves RLQS until it is stopped; a failure goes to errc.
func (s *Server) serveRLQS(errc chan<- error) {
	if s.rlqs == nil {
		return
	}
	go func() {
		if err := s.rlqs.grpc.Serve(s.rlqs.ln); err != nil {
			errc <- fmt.Errorf("server: RLQS gRPC: %w", err)
		}
	}()
}

// stopRLQS ends the RLQS streams: they live as long as their Envoy, so a
// graceful stop would always wait out the drain; Envoys reopen their
// stream on another replica at their next report, and go on with their
// assignments meanwhile, so their shares are kept (rlqs.Service.Drain).
func (s *Server) stopRLQS() {
	if s.rlqs != nil {
		s.rlqs.svc.Drain()
		s.rlqs.grpc.Stop()
	}
}
