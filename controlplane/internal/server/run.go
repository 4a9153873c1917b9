package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/controlplane/internal/policystore"
)

// Ready reports whether the server serves decisions (degraded or not), and
// how: /readyz's answer.
func (s *Server) Ready() (bool, string) {
	switch {
	case !s.serving.Load():
		return false, "not serving (starting or draining)"
	case s.Degraded():
		return true, "ready, degraded: redis unavailable, deciding from this replica's memory store"
	}
	return true, "ready"
}

// Degraded reports whether decisions come from the memory store because
// Redis is unavailable.
func (s *Server) Degraded() bool {
	return s.degrade != nil && s.degrade.Degraded()
}

// readyz serves /readyz.
func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	ok, why := s.Ready()
	if !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	io.WriteString(w, why+"\n")
}

// setHealth updates the gRPC health service: SERVING when Ready and not
// Degraded.
func (s *Server) setHealth() {
	if s.health == nil {
		return // still in New
	}
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ok, _ := s.Ready(); ok && !s.Degraded() {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.health.SetServingStatus("", st)
	s.health.SetServingStatus(rlsv3.RateLimitService_ServiceDesc.ServiceName, st)
}

// Run serves until ctx ends (or a listener fails), then shuts down: it
// turns unready, drains gRPC calls for up to the shutdown timeout (then cuts
// them), stops HTTP and releases the store. It returns nil after a clean
// shutdown on ctx. Run may be called once.
func (s *Server) Run(ctx context.Context) error {
	err := errors.New("server: Run called twice")
	s.runOnce.Do(func() { err = s.run(ctx) })
	return err
}

// policySource says where the policies of snap came from, for the log.
func (s *Server) policySource(snap *policystore.Snapshot) string {
	store := "the " + s.policies.Backend().Name() + " store"
	switch {
	case snap.Version == 0:
		return "start-up policies (the store cannot be read yet)"
	case len(s.cfg.PolicyFiles) > 0:
		return store + " (the policy files own their domains, the store the others)"
	case s.policies.Seeded():
		return "start-up policies, written to the empty " + s.policies.Backend().Name() + " store"
	default:
		return store + " (the start-up policies seed only an empty store; ratectl apply replaces a domain)"
	}
}

func (s *Server) run(ctx context.Context) error {
	sweepCtx, stopSweep := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); s.memory.RunSweeper(sweepCtx, DefaultSweepInterval) }()
	if s.lease != nil {
		wg.Add(1)
		go func() { defer wg.Done(); s.runLease(sweepCtx) }()
	}

	errc := make(chan error, 4+len(s.extra))
	s.serveRLQS(errc)
	go func() {
		if err := s.grpc.Serve(s.grpcLn); err != nil {
			errc <- fmt.Errorf("server: gRPC: %w", err)
		}
	}()
	if s.polGRPC != nil {
		go func() {
			if err := s.polGRPC.Serve(s.polLn); err != nil {
				errc <- fmt.Errorf("server: policy gRPC: %w", err)
			}
		}()
	}
	// Each new policy version replaces the decision service's set whole.
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.policies.Watch(sweepCtx, func(snap *policystore.Snapshot) {
			s.setStoreSet(snap.Set, fmt.Sprintf("policy store version %d", snap.Version), "source", s.policySource(snap))
		})
	}()
	go func() {
		if err := s.http.Serve(s.httpLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("server: HTTP: %w", err)
		}
	}()
	s.serveExtraHTTP(errc)
	if s.client != nil {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		if err := s.ping(pctx); err != nil {
			s.log.Warn("redis does not answer yet: decisions will come from the memory store until it does", "error", err.Error())
		}
		cancel()
	}
	s.serving.Store(true)
	s.setHealth()
	s.log.Info("serving", "grpc", s.GRPCAddr(), "http", s.HTTPAddr(), "policy", s.PolicyAddr(), "rlqs", s.RLQSAddr(), "store", s.store.Name(),
		"domains", strings.Join(domainNames(s.service.Policies()), ","))
	if s.bounds != nil {
		s.log.Info("decision port bounds (grpc-go)", "bounds", s.bounds.String())
	}

	var runErr error
	select {
	case <-ctx.Done():
		s.log.Info("shutting down", "drain_timeout", s.shutdown.String())
	case runErr = <-errc:
		s.log.Error("listener failed: shutting down", "error", runErr.Error())
	}
	s.serving.Store(false)
	s.setHealth()

	// Closing the policy store ends Watch streams, so the drain is not
	// held up by them.
	s.policies.Close()
	s.stopRLQS()
	drained := make(chan struct{})
	go func() {
		if s.polGRPC != nil {
			s.polGRPC.GracefulStop()
		}
		s.grpc.GracefulStop()
		close(drained)
	}()
	timer := time.NewTimer(s.shutdown)
	select {
	case <-drained:
		timer.Stop()
	case <-timer.C:
		s.log.Warn("drain timeout: cutting remaining gRPC calls")
		if s.polGRPC != nil {
			s.polGRPC.Stop()
		}
		s.grpc.Stop()
		<-drained
	}
	hctx, cancel := context.WithTimeout(context.Background(), s.shutdown)
	if err := s.http.Shutdown(hctx); err != nil && runErr == nil {
		runErr = fmt.Errorf("server: HTTP shutdown: %w", err)
	}
	for _, e := range s.extra {
		e.srv.Shutdown(hctx)
	}
	cancel()
	stopSweep()
	wg.Wait()
	s.closeResources()
	s.log.Info("stopped")
	return runErr
}

// closeResources releases the store and the listeners (idempotent enough
// for New's error path and the end of Run).
func (s *Server) closeResources() {
	if s.policies != nil {
		s.policies.Close()
	}
	if s.tempDir != "" {
		os.RemoveAll(s.tempDir)
	}
	if s.degrade != nil {
		s.degrade.Close()
	}
	if s.client != nil {
		s.client.Close()
	}
	if s.rlqs != nil {
		s.rlqs.ln.Close()
	}
	for _, ln := range []net.Listener{s.grpcLn, s.httpLn, s.polLn} {
		if ln != nil {
			ln.Close()
		}
	}
	for _, e := range s.extra {
		e.ln.Close()
	}
}
