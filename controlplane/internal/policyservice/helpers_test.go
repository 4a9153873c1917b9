package policyservice

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	sluicev1 "github.com/sluicehq/sluice/controlplane/api/sluice/v1"
	"github.com/sluicehq/sluice/controlplane/internal/policystore"
	"github.com/sluicehq/sluice/controlplane/internal/rls"
	"github.com/sluicehq/sluice/controlplane/store/memory"
)

// testToken is the bearer token the tests' servers accept.
const testToken = "s3cret-token-0123456789abcdef"

// logBuffer collects log output from several goroutines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written.
func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// replica is one control-plane replica as the server wires it: a policy
// store, the decision service fed by the store's snapshots, and one gRPC
// server carrying both services behind the Authenticator.
type replica struct {
	store *policystore.Store
	rls   *rls.Service
	addr  string     // the gRPC listener
	logs  *logBuffer // every log line of the replica
}

// replicaConfig says how to start a replica.
type replicaConfig struct {
	auth  AuthConfig                       // Logger is set by startReplica
	creds credentials.TransportCredentials // nil: plaintext
}

// startReplica starts a replica on b, stopped when the test ends.
func startReplica(t testing.TB, b policystore.Backend, cfg replicaConfig) *replica {
	t.Helper()
	logs := &logBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	st, err := policystore.New(context.Background(), b, policystore.Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	decisions, err := rls.New(memory.New(memory.Options{}), st.Current().Set, rls.Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		st.Watch(ctx, func(s *policystore.Snapshot) { decisions.SetPolicies(s.Set) })
	}()

	cfg.auth.Logger = log
	auth, err := NewAuthenticator(cfg.auth)
	if err != nil {
		t.Fatal(err)
	}
	opts := auth.ServerOptions()
	if cfg.creds != nil {
		opts = append(opts, grpc.Creds(cfg.creds))
	}
	gs := grpc.NewServer(opts...)
	New(st, Options{Logger: log}).Register(gs)
	decisions.Register(gs)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		gs.Serve(ln)
	}()
	t.Cleanup(func() {
		stop()
		st.Close() // ends Watch streams, so GracefulStop does not wait on them
		gs.GracefulStop()
		<-served
		<-watched
	})
	return &replica{store: st, rls: decisions, addr: ln.Addr().String(), logs: logs}
}

// dial returns a client connection to addr, closed when the test ends.
func dial(t testing.TB, addr string, creds credentials.TransportCredentials) *grpc.ClientConn {
	t.Helper()
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// bearer returns per-RPC credentials sending token.
type bearer string

// GetRequestMetadata returns the authorization header.
func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

// RequireTransportSecurity allows plaintext, as the tests run on loopback.
func (bearer) RequireTransportSecurity() bool { return false }

// policyClient returns a PolicyService client of r sending token ("" for
// none).
func (r *replica) policyClient(t testing.TB, token string) sluicev1.PolicyServiceClient {
	t.Helper()
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer(token)))
	}
	conn, err := grpc.NewClient(r.addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return sluicev1.NewPolicyServiceClient(conn)
}

// rlsClient returns a decision API client of r, without credentials.
func (r *replica) rlsClient(t testing.TB) rlsv3.RateLimitServiceClient {
	return rlsv3.NewRateLimitServiceClient(dial(t, r.addr, nil))
}

// domainYAML is a policy for domain admitting n per second per user.
func domainYAML(domain string, n int) string {
	return fmt.Sprintf("domain: %s\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: second\n      requests_per_unit: %d\n", domain, n)
}
