package redisstore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/tlsfiles"
)

// TLS says how to reach Redis over TLS: standalone, Sentinel (the sentinels
// and the servers they name alike, as go-redis's FailoverOptions.TLSConfig
// does) or Cluster (every node). Certificates are always verified.
type TLS struct {
	// CAFile is a PEM bundle of the CAs that sign the servers'
	// certificates; empty means the system's roots.
	CAFile string
	// CertFile and KeyFile are the client certificate and key, for servers
	// with tls-auth-clients; empty means none. They are read again when the
	// files change, so a rotated certificate is used from the next
	// connection on.
	CertFile, KeyFile string
	// ServerName is the name the servers' certificates must hold; empty
	// means the host of each address dialled.
	ServerName string
}

// keepAlive is go-redis's own TCP keep-alive policy for its default dialer.
var keepAlive = net.KeepAliveConfig{Enable: true, Idle: 30 * time.Second, Interval: 5 * time.Second, Count: 3}

// Dialer returns a dialer for go-redis's Options.Dialer (also
// FailoverOptions and ClusterOptions) that connects over TLS, and the
// tls.Config it uses, for the TLSConfig field beside it. timeout bounds the
// TCP connect and the handshake together. A failed handshake, and a server
// that refuses the client certificate after it (TLS 1.3), give an error
// that says what to check.
func (t TLS) Dialer(timeout time.Duration) (func(ctx context.Context, network, addr string) (net.Conn, error), *tls.Config, error) {
	if timeout <= 0 {
		return nil, nil, fmt.Errorf("redis TLS: dial timeout %v is not positive", timeout)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if t.CAFile != "" {
		pool, err := tlsfiles.CertPool(t.CAFile)
		if err != nil {
			return nil, nil, fmt.Errorf("redis TLS: %w", err)
		}
		cfg.RootCAs = pool
	}
	switch {
	case (t.CertFile == "") != (t.KeyFile == ""):
		return nil, nil, errors.New("redis TLS: the client certificate and its key go together")
	case t.CertFile != "":
		pair, err := tlsfiles.LoadKeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, nil, fmt.Errorf("redis TLS: client %w", err)
		}
		cfg.GetClientCertificate = pair.GetClientCertificate
	}
	d := &net.Dialer{Timeout: timeout, KeepAliveConfig: keepAlive}
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		raw, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		c := cfg
		if c.ServerName == "" {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				host = addr
			}
			c = cfg.Clone()
			c.ServerName = host
		}
		tc := tls.Client(raw, c)
		if err := tc.HandshakeContext(ctx); err != nil {
			raw.Close()
			return nil, &net.OpError{Op: "dial", Net: network, Addr: raw.RemoteAddr(),
				Err: fmt.Errorf("redis TLS handshake: %w%s", err, tlsHint(err))}
		}
		return &tlsConn{tc}, nil
	}
	return dial, cfg, nil
}

// tlsConn is a TLS connection to Redis whose read errors say what to check
// when the server refuses the client after the handshake: in TLS 1.3 a
// client learns that its certificate was refused only on its first read.
type tlsConn struct{ *tls.Conn }

func (c *tlsConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if err != nil {
		if h := refusedHint(err); h != "" {
			err = &net.OpError{Op: "read", Net: "tcp", Addr: c.RemoteAddr(),
				Err: fmt.Errorf("redis TLS: %w%s", err, h)}
		}
	}
	return n, err
}

// tlsHint returns what to check after a failed handshake, " (...)", or ""
// when it has nothing to say.
func tlsHint(err error) string {
	var ua x509.UnknownAuthorityError
	var he x509.HostnameError
	var ci x509.CertificateInvalidError
	var rh tls.RecordHeaderError
	var ne net.Error
	switch {
	case errors.As(err, &ua):
		return " (the server's certificate is not signed by a CA of -redis-tls-ca)"
	case errors.As(err, &he):
		return " (the server's certificate does not hold this name: check -redis-tls-server-name)"
	case errors.As(err, &ci):
		return " (the server's certificate is expired, not yet valid or not for a server)"
	case errors.As(err, &rh):
		return " (the server does not speak TLS on this port: give its tls-port)"
	case errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout():
		return " (no TLS answer in time: is the address the server's tls-port?)"
	}
	return refusedHint(err)
}

// refusedHint returns what to check when the server refused the client's
// certificate (its alert, during the handshake or, in TLS 1.3, after it),
// or "" for any other error.
func refusedHint(err error) string {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "remote error" {
		msg := op.Err.Error()
		if strings.Contains(msg, "certificate") || strings.Contains(msg, "unknown ca") {
			return " (the server refused the client certificate: check -redis-tls-cert and -redis-tls-key, and that the server's tls-ca-cert-file signs them)"
		}
	}
	return ""
}
