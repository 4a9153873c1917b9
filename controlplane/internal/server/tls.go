package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/tlsfiles"
)

// tlsHandshakeTimeout bounds a decision-port client's TLS handshake.
const tlsHandshakeTimeout = 10 * time.Second

// DecisionTLSConfig returns the decision port's TLS configuration
// (Config.GRPCTLS): the server certificate and key, read again on the first
// handshake after either file changes (a rotated certificate is served
// without a restart), and, when clientCAFile is set, mutual TLS: a client
// must present a certificate signed by a CA of that file (read once, at
// start). ALPN offers h2, as gRPC wants.
func DecisionTLSConfig(certFile, keyFile, clientCAFile string) (*tls.Config, error) {
	pair, err := tlsfiles.LoadKeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("decision port TLS: %w", err)
	}
	cfg := &tls.Config{GetCertificate: pair.GetCertificate, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}}
	if clientCAFile != "" {
		if cfg.ClientCAs, err = tlsfiles.CertPool(clientCAFile); err != nil {
			return nil, fmt.Errorf("decision port client %w", err)
		}
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// RequireClientSAN makes cfg, a mutual TLS configuration, accept only
// client certificates that hold san among their DNS names or URIs (a SPIFFE
// ID, say), as envoyproxy/ratelimit's GRPC_CLIENT_TLS_SAN does.
func RequireClientSAN(cfg *tls.Config, san string) {
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("no client certificate")
		}
		leaf := cs.PeerCertificates[0]
		if slices.Contains(leaf.DNSNames, san) {
			return nil
		}
		for _, u := range leaf.URIs {
			if u.String() == san {
				return nil
			}
		}
		return fmt.Errorf("client certificate %q does not hold the subject alternative name %q", leaf.Subject.CommonName, san)
	}
}

// decisionListener returns the listener the unary decision server serves:
// ln itself, or ln wrapped in TLS when Config.GRPCTLS is set (grpc-go does
// its own TLS, through its credentials). It warns when the decision port
// serves plaintext beyond loopback.
func (s *Server) decisionListener(ln net.Listener) net.Listener {
	cfg := s.cfg.GRPCTLS
	if cfg == nil {
		if a, ok := ln.Addr().(*net.TCPAddr); ok && !a.IP.IsLoopback() {
			s.log.Warn("the decision port serves plaintext beyond loopback: set -grpc-tls-cert and -grpc-tls-key (and -grpc-client-ca for mTLS)",
				"grpc", ln.Addr().String())
		}
		return ln
	}
	if s.cfg.GRPCServer == GRPCServerGo {
		return ln
	}
	return &tlsListener{Listener: ln, cfg: cfg}
}

// tlsListener serves TLS on its listener. The handshake happens on a
// connection's first read or write, bounded by tlsHandshakeTimeout, so
// that Accept never waits on a client.
type tlsListener struct {
	net.Listener
	cfg *tls.Config
}

func (l *tlsListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &handshakeConn{Conn: tls.Server(c, l.cfg)}, nil
}

// handshakeConn is a server-side TLS connection whose handshake is bounded
// in time whoever starts it, reader or writer.
type handshakeConn struct {
	*tls.Conn
	once sync.Once
	err  error
}

// handshake runs the handshake once and returns its error.
func (c *handshakeConn) handshake() error {
	c.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), tlsHandshakeTimeout)
		defer cancel()
		c.err = c.Conn.HandshakeContext(ctx)
	})
	return c.err
}

func (c *handshakeConn) Read(b []byte) (int, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Read(b)
}

func (c *handshakeConn) Write(b []byte) (int, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}
