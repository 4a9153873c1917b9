package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/controlplane/api/sluice/v1"
	"github.com/sluicehq/sluice/controlplane/internal/policyservice"
	redisstore "github.com/sluicehq/sluice/controlplane/store/redis"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/testcerts"
)

// dialTLS returns a grpc-go client of addr over TLS with tc.
func dialTLS(t *testing.T, addr string, tc *tls.Config) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// tryAsk makes one ShouldRateLimit call and returns its error.
func tryAsk(conn *grpc.ClientConn) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "srv",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "tls"}}}}})
	return err
}

// TestDecisionTLS: on both decision servers, TLS serves a client that
// trusts the CA and refuses plaintext; mTLS serves a client with a
// certificate of the client CA and refuses one without, or with a
// certificate of another CA.
func TestDecisionTLS(t *testing.T) {
	certs := testcerts.New(t)
	other := testcerts.NewCA(t)
	strangerCert, strangerKey := other.Issue(t, "stranger", false)
	stranger, err := tls.LoadX509KeyPair(strangerCert, strangerKey)
	if err != nil {
		t.Fatal(err)
	}
	serverOnly := &tls.Config{RootCAs: certs.CA.Pool}
	for _, kind := range DecisionServers {
		t.Run(kind, func(t *testing.T) {
			t.Run("tls", func(t *testing.T) {
				cfg, err := DecisionTLSConfig(certs.ServerCert, certs.ServerKey, "")
				if err != nil {
					t.Fatal(err)
				}
				srv := start(t, Config{GRPCServer: kind, Policies: policies(t), GRPCTLS: cfg})
				c := rlsv3.NewRateLimitServiceClient(dialTLS(t, srv.GRPCAddr(), serverOnly))
				clearOfMinuteEnd()
				codes := []rlsv3.RateLimitResponse_Code{ask(t, c, "a").OverallCode, ask(t, c, "a").OverallCode, ask(t, c, "a").OverallCode}
				if codes[0] != rlsv3.RateLimitResponse_OK || codes[2] != rlsv3.RateLimitResponse_OVER_LIMIT {
					t.Errorf("codes over TLS = %v, want OK, OK, OVER_LIMIT", codes)
				}
				if err := tryAsk(dial(t, srv.GRPCAddr())); err == nil {
					t.Error("a plaintext client was served on the TLS port")
				}
				if err := tryAsk(dialTLS(t, srv.GRPCAddr(), &tls.Config{RootCAs: other.Pool})); err == nil ||
					!strings.Contains(err.Error(), "certificate signed by unknown authority") {
					t.Errorf("a client that does not trust the server's CA: %v", err)
				}
			})
			t.Run("mtls", func(t *testing.T) {
				cfg, err := DecisionTLSConfig(certs.ServerCert, certs.ServerKey, certs.CA.File)
				if err != nil {
					t.Fatal(err)
				}
				srv := start(t, Config{GRPCServer: kind, Policies: policies(t), GRPCTLS: cfg})
				if err := tryAsk(dialTLS(t, srv.GRPCAddr(), certs.ClientTLS(t))); err != nil {
					t.Errorf("client with a certificate of the client CA: %v", err)
				}
				// The client learns of the refusal from the server's alert, or
				// from the connection it closed, whichever it reads first.
				err = tryAsk(dialTLS(t, srv.GRPCAddr(), serverOnly))
				t.Logf("without a client certificate: %v", err)
				if status.Code(err) != codes.Unavailable {
					t.Errorf("client without a certificate: %v, want refused (Unavailable)", err)
				}
				err = tryAsk(dialTLS(t, srv.GRPCAddr(), &tls.Config{RootCAs: certs.CA.Pool, Certificates: []tls.Certificate{stranger}}))
				t.Logf("with a certificate of another CA: %v", err)
				if status.Code(err) != codes.Unavailable {
					t.Errorf("client with a certificate of another CA: %v, want refused (Unavailable)", err)
				}
			})
		})
	}
}

// TestDecisionTLSClientSAN: with RequireClientSAN, a certificate of the
// client CA is accepted only when it holds the name.
func TestDecisionTLSClientSAN(t *testing.T) {
	certs := testcerts.New(t)
	cfg, err := DecisionTLSConfig(certs.ServerCert, certs.ServerKey, certs.CA.File)
	if err != nil {
		t.Fatal(err)
	}
	RequireClientSAN(cfg, "sluice.test")
	for _, kind := range DecisionServers {
		srv := start(t, Config{GRPCServer: kind, Policies: policies(t), GRPCTLS: cfg})
		// The server certificate holds sluice.test and is valid for client
		// authentication; the client certificate holds no name.
		named, err := tls.LoadX509KeyPair(certs.ServerCert, certs.ServerKey)
		if err != nil {
			t.Fatal(err)
		}
		if err := tryAsk(dialTLS(t, srv.GRPCAddr(), &tls.Config{RootCAs: certs.CA.Pool, Certificates: []tls.Certificate{named}})); err != nil {
			t.Errorf("%s: a client certificate with the name: %v", kind, err)
		}
		if err := tryAsk(dialTLS(t, srv.GRPCAddr(), certs.ClientTLS(t))); status.Code(err) != codes.Unavailable {
			t.Errorf("%s: a client certificate without the name: %v, want refused", kind, err)
		}
	}
}

// TestDecisionTLSRotation: a certificate replaced on disk is served from
// the next handshake on, without a restart; a broken replacement leaves the
// last good one in use.
func TestDecisionTLSRotation(t *testing.T) {
	certs := testcerts.New(t)
	cfg, err := DecisionTLSConfig(certs.ServerCert, certs.ServerKey, "")
	if err != nil {
		t.Fatal(err)
	}
	srv := start(t, Config{Policies: policies(t), GRPCTLS: cfg})
	served := func() *x509.Certificate {
		t.Helper()
		c, err := tls.Dial("tcp", srv.GRPCAddr(), &tls.Config{RootCAs: certs.CA.Pool, NextProtos: []string{"h2"}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if p := c.ConnectionState().NegotiatedProtocol; p != "h2" {
			t.Errorf("ALPN protocol %q, want h2", p)
		}
		return c.ConnectionState().PeerCertificates[0]
	}
	first := served()
	// A later modification time, as a rotation minutes later would have (the
	// file system's clock may not tick between the two writes here).
	later := time.Now().Add(time.Minute)
	touch := func(files ...string) {
		for _, f := range files {
			if err := os.Chtimes(f, later, later); err != nil {
				t.Fatal(err)
			}
		}
		later = later.Add(time.Minute)
	}
	certs.CA.Issue(t, "server", true) // rewrites server.crt and server.key
	touch(certs.ServerCert, certs.ServerKey)
	second := served()
	if second.SerialNumber.Cmp(first.SerialNumber) == 0 {
		t.Fatal("the rotated certificate is not served")
	}
	if err := os.WriteFile(certs.ServerKey, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	touch(certs.ServerKey)
	if got := served(); got.SerialNumber.Cmp(second.SerialNumber) != 0 {
		t.Error("a broken key replaced the last good certificate")
	}
	if c := rlsv3.NewRateLimitServiceClient(dialTLS(t, srv.GRPCAddr(), &tls.Config{RootCAs: certs.CA.Pool})); ask(t, c, "r").OverallCode != rlsv3.RateLimitResponse_OK {
		t.Error("no decision after the rotations")
	}
}

// syncBuffer is a log destination safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestServeRedisTLS: with the right CA and client certificate decisions
// come from Redis over TLS; with a wrong CA the server starts degraded and
// its log says to check the CA.
func TestServeRedisTLS(t *testing.T) {
	SetRedisLogger(quiet)
	certs := testcerts.New(t)
	rs := redistest.StartServer(t, redistest.WithTLS(redistest.TLS{CAFile: certs.CA.File, CertFile: certs.ServerCert, KeyFile: certs.ServerKey}))
	good := &redisstore.TLS{CAFile: certs.CA.File, CertFile: certs.ClientCert, KeyFile: certs.ClientKey}

	srv := start(t, Config{Policies: policies(t), Redis: RedisConfig{Addrs: []string{rs.Addr()}, TLS: good}})
	c := rlsv3.NewRateLimitServiceClient(dial(t, srv.GRPCAddr()))
	// The limit is 2 a minute in a clock-aligned window: three calls that
	// straddle a minute's end are tried again on a fresh key.
	for try := 0; ; try++ {
		user, minute := fmt.Sprintf("over-tls-%d", try), time.Now().Unix()/60
		ask(t, c, user)
		ask(t, c, user)
		r := ask(t, c, user)
		if time.Now().Unix()/60 != minute && try < 2 {
			continue
		}
		if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || srv.Degraded() {
			t.Errorf("third decision over Redis TLS: %v, degraded %v", r.OverallCode, srv.Degraded())
		}
		break
	}

	var log syncBuffer
	bad := &redisstore.TLS{CAFile: testcerts.NewCA(t).File, CertFile: certs.ClientCert, KeyFile: certs.ClientKey}
	srv = start(t, Config{Policies: policies(t), Redis: RedisConfig{Addrs: []string{rs.Addr()}, TLS: bad},
		Logger: slog.New(slog.NewTextHandler(&log, nil))})
	c = rlsv3.NewRateLimitServiceClient(dial(t, srv.GRPCAddr()))
	// Every call is answered (from the memory store); a sustained failure
	// degrades the server.
	n := 0
	waitUntil(t, "degraded with a wrong CA", 5*time.Second, func() bool {
		n++
		if r := ask(t, c, "wrong-ca-"+strconv.Itoa(n)); r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("with a wrong CA: %v, want OK from the memory store", r.OverallCode)
		}
		return srv.Degraded()
	})
	for _, want := range []string{"redis TLS handshake", "x509: certificate signed by unknown authority", "-redis-tls-ca"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("the log does not say %q:\n%s", want, log.String())
		}
	}
}

// addrListener is a listener that reports another address.
type addrListener struct {
	net.Listener
	addr net.Addr
}

func (l addrListener) Addr() net.Addr { return l.addr }

// TestDecisionListener: plaintext beyond loopback is warned about; the
// unary server gets a TLS listener, grpc-go the plain one (its credentials
// do TLS).
func TestDecisionListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	certs := testcerts.New(t)
	tc, err := DecisionTLSConfig(certs.ServerCert, certs.ServerKey, "")
	if err != nil {
		t.Fatal(err)
	}
	wide := addrListener{ln, &net.TCPAddr{IP: net.IPv4zero, Port: 8081}}
	for _, c := range []struct {
		name    string
		cfg     Config
		ln      net.Listener
		warn    bool
		wrapped bool
	}{
		{"loopback plaintext", Config{GRPCServer: GRPCServerUnary}, ln, false, false},
		{"wide plaintext", Config{GRPCServer: GRPCServerUnary}, wide, true, false},
		{"wide TLS, unary", Config{GRPCServer: GRPCServerUnary, GRPCTLS: tc}, wide, false, true},
		{"wide TLS, grpc-go", Config{GRPCServer: GRPCServerGo, GRPCTLS: tc}, wide, false, false},
	} {
		var log syncBuffer
		s := &Server{cfg: c.cfg, log: slog.New(slog.NewTextHandler(&log, nil))}
		got := s.decisionListener(c.ln)
		_, wrapped := got.(*tlsListener)
		warned := strings.Contains(log.String(), "plaintext beyond loopback")
		if wrapped != c.wrapped || warned != c.warn {
			t.Errorf("%s: TLS listener %v, warned %v; want %v, %v", c.name, wrapped, warned, c.wrapped, c.warn)
		}
	}
}

// TestPolicyServiceMTLS: the policy service over mutual TLS, its
// connections read through the frame guard (which wraps the TLS
// credentials): a client with a certificate of the client CA is served
// and identified; one without is refused.
func TestPolicyServiceMTLS(t *testing.T) {
	certs := testcerts.New(t)
	tc, err := policyservice.ServerTLSConfig(certs.ServerCert, certs.ServerKey, true)
	if err != nil {
		t.Fatal(err)
	}
	srv := start(t, Config{Policies: policies(t), PolicyAddr: "127.0.0.1:0", PolicyTLS: tc,
		PolicyAuth: policyservice.AuthConfig{ClientCAs: certs.CA.Pool}})
	list := func(cfg *tls.Config) error {
		cc, err := grpc.NewClient(srv.PolicyAddr(), grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = sluicev1.NewPolicyServiceClient(cc).List(ctx, &sluicev1.ListRequest{})
		return err
	}
	if err := list(certs.ClientTLS(t)); err != nil {
		t.Errorf("client with a certificate of the client CA: %v", err)
	}
	if err := list(&tls.Config{RootCAs: certs.CA.Pool}); err == nil {
		t.Error("a client without a certificate was served")
	}
}
