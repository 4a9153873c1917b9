package policyservice

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	sluicev1 "github.com/sluicehq/sluice/controlplane/api/sluice/v1"
)

// MinTokenLen is the shortest bearer token accepted.
const MinTokenLen = 16

// DefaultTokenEnv is the environment variable LoadTokens reads by default.
const DefaultTokenEnv = "SLUICE_TOKEN"

// guardedPrefix is the prefix of the methods the Authenticator guards.
var guardedPrefix = "/" + sluicev1.PolicyService_ServiceDesc.ServiceName + "/"

// AuthConfig says which credentials the policy service accepts. At least one
// of Tokens and ClientCAs must be set, unless AllowUnauthenticated.
type AuthConfig struct {
	// Tokens are the accepted bearer tokens (several allow rotation).
	Tokens []string
	// ClientCAs, when set, accepts a client certificate that chains to one
	// of these CAs and is valid for client authentication. The listener's
	// TLS config must ask for client certificates (ServerTLSConfig does).
	ClientCAs *x509.CertPool
	// AllowUnauthenticated turns authentication off, for a policy service
	// reachable only from trusted hosts. Logged loudly.
	AllowUnauthenticated bool
	// Logger receives refusals; nil means slog.Default().
	Logger *slog.Logger
}

// Authenticator checks the credentials of PolicyService calls. Calls to
// other services (the decision API) pass untouched.
type Authenticator struct {
	tokens [][sha256.Size]byte // SHA-256 of each accepted token
	cas    *x509.CertPool
	open   bool
	log    *slog.Logger
}

// NewAuthenticator returns an Authenticator for cfg.
func NewAuthenticator(cfg AuthConfig) (*Authenticator, error) {
	a := &Authenticator{cas: cfg.ClientCAs, open: cfg.AllowUnauthenticated, log: cfg.Logger}
	if a.log == nil {
		a.log = slog.Default()
	}
	for i, t := range cfg.Tokens {
		if err := checkToken(t); err != nil {
			return nil, fmt.Errorf("policy service: token %d: %v", i+1, err)
		}
		a.tokens = append(a.tokens, sha256.Sum256([]byte(t)))
	}
	switch {
	case a.open:
		a.log.Warn("policy service: authentication is OFF: anyone who can reach the policy listener can change the rate limits")
	case len(a.tokens) == 0 && a.cas == nil:
		return nil, errors.New("policy service: no credentials configured: give a bearer token (file or environment variable) or a client CA for mTLS")
	}
	return a, nil
}

// checkToken checks a token's form, without ever quoting it.
func checkToken(t string) error {
	switch {
	case len(t) < MinTokenLen:
		return fmt.Errorf("too short (%d characters; use at least %d, e.g. the output of `openssl rand -hex 32`)", len(t), MinTokenLen)
	case strings.IndexFunc(t, func(r rune) bool { return r <= ' ' || r == 0x7f }) >= 0:
		return errors.New("contains spaces or control characters")
	}
	return nil
}

// LoadTokens reads the accepted bearer tokens: from file when it is not
// empty (one token per line; blank lines and lines starting with # are
// skipped), else from the environment variable env (one token). Errors name
// the file and line or the variable, never the token.
func LoadTokens(file, env string) ([]string, error) {
	if file != "" {
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("token file: %v", err)
		}
		var tokens []string
		sc := bufio.NewScanner(bytes.NewReader(data))
		for n := 1; sc.Scan(); n++ {
			line := strings.TrimSpace(sc.Text())
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			if err := checkToken(line); err != nil {
				return nil, fmt.Errorf("token file %s, line %d: %v", file, n, err)
			}
			tokens = append(tokens, line)
		}
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("token file %s: %v", file, err)
		}
		if len(tokens) == 0 {
			return nil, fmt.Errorf("token file %s holds no token", file)
		}
		return tokens, nil
	}
	if env == "" {
		return nil, nil
	}
	t, ok := os.LookupEnv(env)
	if !ok {
		return nil, nil
	}
	t = strings.TrimSpace(t)
	if err := checkToken(t); err != nil {
		return nil, fmt.Errorf("environment variable %s: %v", env, err)
	}
	return []string{t}, nil
}

// ServerTLSConfig returns a TLS config for the policy listener with the
// server's certificate and key. When mTLS is wanted (clientCAs true) it
// asks every client for a certificate; the Authenticator verifies it against
// AuthConfig.ClientCAs, so a client with a wrong certificate gets
// Unauthenticated with a reason (rather than a failed handshake), and a
// client with none may still use a bearer token.
func ServerTLSConfig(certFile, keyFile string, clientCAs bool) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("policy service TLS: certificate %s / key %s: %v", certFile, keyFile, err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if clientCAs {
		cfg.ClientAuth = tls.RequestClientCert
	}
	return cfg, nil
}

// ServerOptions returns the options that install the Authenticator on a
// grpc.Server: TapHandle, and the interceptors.
func (a *Authenticator) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.InTapHandle(a.TapHandle),
		grpc.ChainUnaryInterceptor(a.UnaryInterceptor()),
		grpc.ChainStreamInterceptor(a.StreamInterceptor()),
	}
}

// TapHandle refuses a PolicyService call without valid credentials as soon
// as its headers arrive, before any of its message is read: a client
// without credentials cannot make the server buffer a policy-sized body
// (1 MiB) on each of its streams. The interceptors then attach the caller's
// identity to the calls it lets through.
func (a *Authenticator) TapHandle(ctx context.Context, info *tap.Info) (context.Context, error) {
	if !strings.HasPrefix(info.FullMethodName, guardedPrefix) {
		return ctx, nil
	}
	if _, err := a.authenticate(ctx, info.FullMethodName); err != nil {
		return nil, err
	}
	return ctx, nil
}

// UnaryInterceptor authenticates unary PolicyService calls.
func (a *Authenticator) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if !strings.HasPrefix(info.FullMethod, guardedPrefix) {
			return handler(ctx, req)
		}
		ctx, err := a.authenticate(ctx, info.FullMethod)
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamInterceptor authenticates streaming PolicyService calls.
func (a *Authenticator) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if !strings.HasPrefix(info.FullMethod, guardedPrefix) {
			return handler(srv, ss)
		}
		ctx, err := a.authenticate(ss.Context(), info.FullMethod)
		if err != nil {
			return err
		}
		return handler(srv, &identifiedStream{ServerStream: ss, ctx: ctx})
	}
}

// identifiedStream carries the caller's identity in its context.
type identifiedStream struct {
	grpc.ServerStream
	ctx context.Context
}

// Context returns the context with the identity.
func (s *identifiedStream) Context() context.Context { return s.ctx }

// identityKey is the context key of the caller's identity.
type identityKey struct{}

// IdentityFrom returns who made the call, as the Authenticator established
// it: "client certificate CN=...", "bearer token #N", or "unauthenticated".
func IdentityFrom(ctx context.Context) string {
	if id, ok := ctx.Value(identityKey{}).(string); ok {
		return id
	}
	return "unauthenticated"
}

// authenticate checks the call's credentials: a verified client
// certificate, else a bearer token. A refusal is logged (method, peer,
// reason; never the token) and returned as Unauthenticated.
func (a *Authenticator) authenticate(ctx context.Context, method string) (context.Context, error) {
	id, reason := a.identify(ctx)
	if id != "" {
		return context.WithValue(ctx, identityKey{}, id), nil
	}
	if a.open {
		return ctx, nil
	}
	addr := "unknown"
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		addr = p.Addr.String()
	}
	a.log.Warn("policy service: refused a call", "method", method, "peer", addr, "reason", reason)
	return nil, status.Error(codes.Unauthenticated, reason)
}

// identify returns the caller's identity, or "" and why there is none.
func (a *Authenticator) identify(ctx context.Context) (id, reason string) {
	certReason := "" // why a presented client certificate was refused
	if a.cas != nil {
		id, certReason = a.verifyCert(ctx)
		if id != "" {
			return id, ""
		}
	}
	vals := metadata.ValueFromIncomingContext(ctx, "authorization")
	switch {
	case len(vals) == 0 && certReason != "":
		return "", certReason
	case len(vals) == 0 && len(a.tokens) == 0:
		return "", "no client certificate: this policy service requires mTLS"
	case len(vals) == 0 && a.cas != nil:
		return "", "no credentials: send the header `authorization: Bearer <token>` or a client certificate"
	case len(vals) == 0:
		return "", "no credentials: send the header `authorization: Bearer <token>`"
	case len(vals) > 1:
		return "", "more than one authorization header"
	case len(a.tokens) == 0:
		return "", "bearer tokens are not accepted here: use a client certificate (mTLS)"
	}
	scheme, token, ok := strings.Cut(vals[0], " ")
	token = strings.TrimSpace(token)
	if !ok || !strings.EqualFold(scheme, "bearer") || token == "" {
		return "", "the authorization header is not `Bearer <token>`"
	}
	sum := sha256.Sum256([]byte(token))
	match := 0
	for i, t := range a.tokens {
		// Compare against every token, so the time taken does not tell
		// which one (if any) matched.
		if subtle.ConstantTimeCompare(sum[:], t[:]) == 1 {
			match = i + 1
		}
	}
	if match == 0 {
		return "", "invalid bearer token"
	}
	return fmt.Sprintf("bearer token #%d", match), ""
}

// verifyCert verifies the peer's client certificate against the CAs. It
// returns the identity, or why a presented certificate is refused ("" when
// none was presented).
func (a *Authenticator) verifyCert(ctx context.Context) (id, reason string) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "", ""
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 {
		return "", ""
	}
	certs := info.State.PeerCertificates
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	_, err := certs[0].Verify(x509.VerifyOptions{
		Roots:         a.cas,
		Intermediates: inter,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		return "", "client certificate not accepted: " + err.Error()
	}
	name := certs[0].Subject.CommonName
	if name == "" && len(certs[0].DNSNames) > 0 {
		name = certs[0].DNSNames[0]
	}
	return "client certificate CN=" + name, ""
}
