package main

import (
	"context"
	"crypto/tls"
	"io"
	"os/exec"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/testcerts"
)

// callTLS makes one ShouldRateLimit call over TLS and returns its answer.
func callTLS(addr string, tc *tls.Config, user string) (*rlsv3.RateLimitResponse, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
		Domain:      "bin",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: user}}}},
	})
}

// TestBinaryTLS runs the binary with TLS to Redis (from the environment)
// and mTLS on the decision port (from flags): decisions land in Redis, a
// client without a certificate is refused; with a wrong Redis CA the binary
// serves degraded and its log says which flag to check.
func TestBinaryTLS(t *testing.T) {
	certs := testcerts.New(t)
	rs := redistest.StartServer(t, redistest.WithTLS(redistest.TLS{CAFile: certs.CA.File, CertFile: certs.ServerCert, KeyFile: certs.ServerKey}))
	env := []string{"SLUICE_REDIS_ADDRS=" + rs.Addr(), "SLUICE_POLICY=" + writePolicy(t, binPolicy),
		"SLUICE_REDIS_TLS_CA=" + certs.CA.File, "SLUICE_REDIS_TLS_CERT=" + certs.ClientCert, "SLUICE_REDIS_TLS_KEY=" + certs.ClientKey}
	grpcTLS := []string{"-grpc-tls-cert", certs.ServerCert, "-grpc-tls-key", certs.ServerKey, "-grpc-client-ca", certs.CA.File}

	p, rec := startBinary(t, env, grpcTLS...)
	addr := rec["grpc"].(string)
	var remaining []uint32
	for range 2 {
		r, err := callTLS(addr, certs.ClientTLS(t), "tls")
		if err != nil {
			t.Fatalf("ShouldRateLimit over mTLS: %v", err)
		}
		remaining = append(remaining, r.Statuses[0].LimitRemaining)
	}
	if remaining[0] != 1 || remaining[1] != 0 {
		t.Errorf("remaining %v, want [1 0]", remaining)
	}
	if _, err := callTLS(addr, &tls.Config{RootCAs: certs.CA.Pool}, "tls"); err == nil {
		t.Error("a client without a certificate was served")
	}
	if strings.Contains(p.output(), "degraded") || strings.Contains(p.output(), "redis does not answer") {
		t.Errorf("degraded with the right Redis CA:\n%s", p.output())
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit %d after SIGTERM:\n%s", code, p.output())
	}

	wrong := testcerts.NewCA(t)
	env[2] = "SLUICE_REDIS_TLS_CA=" + wrong.File
	p, _ = startBinary(t, env, grpcTLS...)
	out := p.output()
	for _, want := range []string{"redis does not answer yet", "redis TLS handshake", "certificate signed by unknown authority", "-redis-tls-ca"} {
		if !strings.Contains(out, want) {
			t.Errorf("the log does not say %q:\n%s", want, out)
		}
	}
	p.stop(t)

	// Unreadable TLS files stop the start with status 2.
	bin, err := binary()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-redis-addrs", rs.Addr(), "-redis-tls-ca", certs.CA.File + ".missing"}, "redis TLS: CA file"},
		{[]string{"-grpc-tls-cert", certs.ServerCert, "-grpc-tls-key", certs.ClientKey}, "decision port TLS"},
		{[]string{"-redis-tls"}, "takes no Redis addresses, master name or TLS"},
	} {
		cmd := exec.Command(bin, append([]string{"-grpc-addr", "127.0.0.1:0", "-http-addr", "127.0.0.1:0"}, c.args...)...)
		out, err := cmd.CombinedOutput()
		if cmd.ProcessState.ExitCode() != 2 || !strings.Contains(string(out), c.want) {
			t.Errorf("%v: exit %d (%v), output %s; want 2 and %q", c.args, cmd.ProcessState.ExitCode(), err, out, c.want)
		}
	}
}

func TestParseTLSFlags(t *testing.T) {
	c, err := parseFlags(nil, func(k string) string {
		return map[string]string{"SLUICE_REDIS_TLS_SERVER_NAME": "redis.internal", "SLUICE_GRPC_TLS_CERT": "c.pem", "SLUICE_GRPC_TLS_KEY": "k.pem"}[k]
	}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !c.redisTLS || c.redisTLSFiles.ServerName != "redis.internal" || c.grpcCert != "c.pem" || c.grpcKey != "k.pem" {
		t.Errorf("parsed %+v", c)
	}
	if c, err := parseFlags([]string{"-redis-tls"}, func(string) string { return "" }, io.Discard); err != nil || !c.redisTLS {
		t.Errorf("-redis-tls: %+v, %v", c, err)
	}
	for _, b := range []struct {
		args []string
		want string
	}{
		{[]string{"-grpc-tls-cert", "c.pem"}, "-grpc-tls-cert and -grpc-tls-key go together"},
		{[]string{"-grpc-client-ca", "ca.pem"}, "-grpc-client-ca needs TLS"},
		{[]string{"-grpc-tls-cert", "c.pem", "-grpc-tls-key", "k.pem", "-grpc-client-san", "x"}, "-grpc-client-san needs mTLS"},
		{[]string{"-redis-tls-key", "k.pem"}, "-redis-tls-cert and -redis-tls-key go together"},
	} {
		if _, err := parseFlags(b.args, func(string) string { return "" }, io.Discard); err == nil || !strings.Contains(err.Error(), b.want) {
			t.Errorf("%v: %v, want %q", b.args, err, b.want)
		}
	}
}
