package policyservice

import (
	"context"
	"crypto/tls"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/controlplane/api/sluice/v1"
	"github.com/sluicehq/sluice/controlplane/internal/policystore"
	"github.com/sluicehq/sluice/internal/testcerts"
	"github.com/sluicehq/sluice/internal/tlsfiles"
)

// newFileBackend returns a file backend in a temporary directory.
func newFileBackend(t testing.TB) policystore.Backend {
	t.Helper()
	b, err := policystore.NewFile(filepath.Join(t.TempDir(), "policies.json"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// wantCode fails the test unless err has code c and its message holds
// every want.
func wantCode(t testing.TB, what string, err error, c codes.Code, want ...string) {
	t.Helper()
	if status.Code(err) != c {
		t.Fatalf("%s: err = %v; want %v", what, err, c)
	}
	for _, w := range want {
		if !strings.Contains(status.Convert(err).Message(), w) {
			t.Errorf("%s: message %q lacks %q", what, status.Convert(err).Message(), w)
		}
	}
}

// TestBearerToken: calls without a token, with a wrong one or a malformed
// header are refused with Unauthenticated and logged; the decision API on
// the same server needs no token; no token ever reaches the logs.
func TestBearerToken(t *testing.T) {
	r := startReplica(t, newFileBackend(t), replicaConfig{auth: AuthConfig{Tokens: []string{"another-token-abcdefghijkl", testToken}}})
	ctx := context.Background()
	wrongToken := "wrong-token-0123456789abcdef"

	none := r.policyClient(t, "")
	_, err := none.List(ctx, &sluicev1.ListRequest{})
	wantCode(t, "List without a token", err, codes.Unauthenticated, "authorization: Bearer")
	_, err = none.Apply(ctx, &sluicev1.ApplyRequest{Yaml: domainYAML("api", 5)})
	wantCode(t, "Apply without a token", err, codes.Unauthenticated)
	stream, err := none.Watch(ctx, &sluicev1.WatchRequest{})
	if err == nil {
		_, err = stream.Recv()
	}
	wantCode(t, "Watch without a token", err, codes.Unauthenticated)

	wrong := r.policyClient(t, wrongToken)
	_, err = wrong.Apply(ctx, &sluicev1.ApplyRequest{Yaml: domainYAML("api", 5)})
	wantCode(t, "Apply with a wrong token", err, codes.Unauthenticated, "invalid bearer token")
	_, err = wrong.Delete(ctx, &sluicev1.DeleteRequest{Domain: "api"})
	wantCode(t, "Delete with a wrong token", err, codes.Unauthenticated)

	conn := dial(t, r.addr, nil)
	basic := metadata.AppendToOutgoingContext(ctx, "authorization", "Basic "+testToken)
	_, err = sluicev1.NewPolicyServiceClient(conn).List(basic, &sluicev1.ListRequest{})
	wantCode(t, "a Basic authorization header", err, codes.Unauthenticated, "not `Bearer <token>`")
	twice := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+testToken, "authorization", "Bearer "+testToken)
	_, err = sluicev1.NewPolicyServiceClient(conn).List(twice, &sluicev1.ListRequest{})
	wantCode(t, "two authorization headers", err, codes.Unauthenticated, "more than one")

	if v, _ := r.store.Backend().Version(ctx); v != 1 {
		t.Fatalf("refused calls changed the store: version %d", v)
	}

	good := r.policyClient(t, testToken)
	res, err := good.Apply(ctx, &sluicev1.ApplyRequest{Yaml: domainYAML("api", 5), Source: "api.yaml"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := good.Get(ctx, &sluicev1.GetRequest{Domain: "api"}); err != nil {
		t.Fatal(err)
	}
	// The decision API on the same server needs no credentials.
	dec, err := r.rlsClient(t).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "x"}}}}})
	if err != nil || dec.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() != 5 {
		t.Fatalf("decision without credentials: %v, %v; want the applied limit of 5", dec, err)
	}

	logs := r.logs.String()
	for _, secret := range []string{testToken, wrongToken, "another-token"} {
		if strings.Contains(logs, secret) {
			t.Fatalf("a token appears in the logs:\n%s", logs)
		}
	}
	if n := strings.Count(logs, "refused a call"); n != 7 {
		t.Errorf("%d refusals logged; want 7:\n%s", n, logs)
	}
	for _, want := range []string{"method=/sluice.v1.PolicyService/Apply", "peer=127.0.0.1:", `reason="invalid bearer token"`,
		"method=/sluice.v1.PolicyService/Watch", "by=\"bearer token #2\"", "domain=api", "version=" + itoa(res.Version)} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %q:\n%s", want, logs)
		}
	}
}

// itoa formats a version.
func itoa(v uint64) string { return big.NewInt(0).SetUint64(v).String() }

// TestAuthConfigErrors: a service without credentials does not start,
// weak tokens are refused, and the errors never quote the token.
func TestAuthConfigErrors(t *testing.T) {
	if _, err := NewAuthenticator(AuthConfig{}); err == nil || !strings.Contains(err.Error(), "no credentials configured") {
		t.Fatalf("no credentials: %v", err)
	}
	if _, err := NewAuthenticator(AuthConfig{AllowUnauthenticated: true}); err != nil {
		t.Fatalf("AllowUnauthenticated: %v", err)
	}
	for _, tok := range []string{"x7q9z", "has a space in it 0123456789", "tab\there-0123456789abcdef"} {
		_, err := NewAuthenticator(AuthConfig{Tokens: []string{tok}})
		if err == nil || strings.Contains(err.Error(), tok) {
			t.Errorf("token %q: err = %v; want an error that does not quote it", tok, err)
		}
	}

	dir := t.TempDir()
	file := filepath.Join(dir, "tokens")
	os.WriteFile(file, []byte("# rotation: old then new\n\n  first-token-0123456789abc  \nsecond-token-0123456789abc\n"), 0o600)
	toks, err := LoadTokens(file, "UNUSED")
	if err != nil || len(toks) != 2 || toks[0] != "first-token-0123456789abc" || toks[1] != "second-token-0123456789abc" {
		t.Fatalf("LoadTokens(file) = %q, %v", toks, err)
	}
	bad := filepath.Join(dir, "bad")
	os.WriteFile(bad, []byte("good-token-0123456789abcdef\ntiny\n"), 0o600)
	if _, err := LoadTokens(bad, ""); err == nil || !strings.Contains(err.Error(), "line 2") || strings.Contains(err.Error(), "tiny") {
		t.Fatalf("LoadTokens(bad) = %v; want line 2 named, the token not quoted", err)
	}
	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, []byte("# nothing\n"), 0o600)
	if _, err := LoadTokens(empty, ""); err == nil || !strings.Contains(err.Error(), "holds no token") {
		t.Fatalf("LoadTokens(empty) = %v", err)
	}
	if _, err := LoadTokens(filepath.Join(dir, "missing"), ""); err == nil {
		t.Fatal("LoadTokens(missing): no error")
	}
	t.Setenv("SLUICE_TEST_TOKEN", " env-token-0123456789abcdef\n")
	if toks, err := LoadTokens("", "SLUICE_TEST_TOKEN"); err != nil || len(toks) != 1 || toks[0] != "env-token-0123456789abcdef" {
		t.Fatalf("LoadTokens(env) = %q, %v", toks, err)
	}
	t.Setenv("SLUICE_TEST_TOKEN", "weak")
	if _, err := LoadTokens("", "SLUICE_TEST_TOKEN"); err == nil || !strings.Contains(err.Error(), "SLUICE_TEST_TOKEN") || strings.Contains(err.Error(), "weak") {
		t.Fatalf("LoadTokens(weak env) = %v", err)
	}
	if toks, err := LoadTokens("", "SLUICE_TEST_UNSET_VARIABLE"); err != nil || toks != nil {
		t.Fatalf("LoadTokens(unset env) = %q, %v; want none", toks, err)
	}
}

// TestMutualTLS: a client certificate signed by the configured CA is
// accepted; one from another CA, one not for client authentication, or
// none at all is refused with Unauthenticated and a reason.
func TestMutualTLS(t *testing.T) {
	pki := testcerts.NewCA(t)
	other := testcerts.NewCA(t)
	serverCert, serverKey := pki.Issue(t, "localhost", true)
	tlsCfg, err := ServerTLSConfig(serverCert, serverKey, true)
	if err != nil {
		t.Fatal(err)
	}
	caPool, err := tlsfiles.CertPool(pki.File)
	if err != nil {
		t.Fatal(err)
	}
	r := startReplica(t, newFileBackend(t), replicaConfig{
		auth:  AuthConfig{ClientCAs: caPool},
		creds: credentials.NewTLS(tlsCfg),
	})
	ctx := context.Background()
	client := func(certFile, keyFile string) sluicev1.PolicyServiceClient {
		cfg := &tls.Config{RootCAs: pki.Pool, ServerName: "localhost"}
		if certFile != "" {
			c, err := tls.LoadX509KeyPair(certFile, keyFile)
			if err != nil {
				t.Fatal(err)
			}
			cfg.Certificates = []tls.Certificate{c}
		}
		return sluicev1.NewPolicyServiceClient(dial(t, r.addr, credentials.NewTLS(cfg)))
	}

	okCert, okKey := pki.Issue(t, "operator", false)
	if _, err := client(okCert, okKey).Apply(ctx, &sluicev1.ApplyRequest{Yaml: domainYAML("api", 5)}); err != nil {
		t.Fatalf("Apply with a good client certificate: %v", err)
	}
	_, err = client("", "").List(ctx, &sluicev1.ListRequest{})
	wantCode(t, "no client certificate", err, codes.Unauthenticated, "requires mTLS")
	strangerCert, strangerKey := other.Issue(t, "stranger", false)
	_, err = client(strangerCert, strangerKey).List(ctx, &sluicev1.ListRequest{})
	wantCode(t, "a certificate from another CA", err, codes.Unauthenticated, "client certificate not accepted")
	serverUse, serverUseKey := pki.IssueServerOnly(t, "not-a-client")
	_, err = client(serverUse, serverUseKey).List(ctx, &sluicev1.ListRequest{})
	wantCode(t, "a certificate not for client authentication", err, codes.Unauthenticated, "client certificate not accepted")

	// A plaintext client cannot even connect.
	_, err = sluicev1.NewPolicyServiceClient(dial(t, r.addr, insecure.NewCredentials())).List(ctx, &sluicev1.ListRequest{})
	if err == nil {
		t.Fatal("a plaintext client was answered by the TLS listener")
	}
	logs := r.logs.String()
	for _, want := range []string{`by="client certificate CN=operator"`, "refused a call", "certificate signed by unknown authority"} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %q:\n%s", want, logs)
		}
	}
}

// TestTokenOrCertificate: with both configured, either credential works.
func TestTokenOrCertificate(t *testing.T) {
	pki := testcerts.NewCA(t)
	serverCert, serverKey := pki.Issue(t, "localhost", true)
	tlsCfg, err := ServerTLSConfig(serverCert, serverKey, true)
	if err != nil {
		t.Fatal(err)
	}
	r := startReplica(t, newFileBackend(t), replicaConfig{
		auth:  AuthConfig{ClientCAs: pki.Pool, Tokens: []string{testToken}},
		creds: credentials.NewTLS(tlsCfg),
	})
	ctx := context.Background()
	tlsOnly := credentials.NewTLS(&tls.Config{RootCAs: pki.Pool, ServerName: "localhost"})
	conn, err := grpc.NewClient(r.addr, grpc.WithTransportCredentials(tlsOnly), grpc.WithPerRPCCredentials(bearer(testToken)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := sluicev1.NewPolicyServiceClient(conn).List(ctx, &sluicev1.ListRequest{}); err != nil {
		t.Fatalf("token over TLS without a client certificate: %v", err)
	}
	_, err = sluicev1.NewPolicyServiceClient(dial(t, r.addr, tlsOnly)).List(ctx, &sluicev1.ListRequest{})
	wantCode(t, "neither", err, codes.Unauthenticated, "or a client certificate")
	if _, err := ServerTLSConfig(filepath.Join(t.TempDir(), "missing.pem"), serverKey, false); err == nil || !strings.Contains(err.Error(), "missing.pem") {
		t.Fatalf("ServerTLSConfig with a missing file: %v", err)
	}
	if _, err := tlsfiles.CertPool(serverKey); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Fatalf("CertPool of a key file: %v", err)
	}
}
