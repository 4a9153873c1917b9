package server

import (
	"fmt"
	"net"

	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/controlplane/rlqs"
)

// rlqsPart is Envoy's Rate Limit Quota Service on its own listener (off
// unless Config.RLQSAddr is set).
type rlqsPart struct {
	svc  *rlqs.Service
	grpc *grpc.Server
	ln   net.Listener
}

// buildRLQS makes the RLQS service and opens its listener, when asked for.
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
	if sc.IdleTimeout == 0 {
		sc.IdleTimeout = s.cfg.IdleTimeout
	}
	s.rlqs = &rlqsPart{svc: svc, grpc: rlqs.NewGRPCServer(svc, sc), ln: s.limit(ln, "rlqs", rlqs.MaxConnsOf(sc))}
	return nil
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
// stream on another replica at their next report.
func (s *Server) stopRLQS() {
	if s.rlqs != nil {
		s.rlqs.grpc.Stop()
	}
}
