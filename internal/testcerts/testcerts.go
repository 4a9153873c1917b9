// Package testcerts makes short-lived ECDSA certificates for tests: a CA,
// and server and client certificates it signs, written as PEM files in the
// test's temporary directory.
package testcerts

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Validity is how long the certificates are valid, from a minute before
// they are made (clock skew between this process and a server under test).
const Validity = time.Hour

// ServerNames are the names every server certificate holds besides the
// loopback addresses: "localhost", and a name that resolves nowhere, for
// tests that set the TLS server name explicitly.
var ServerNames = []string{"localhost", "sluice.test"}

// CA is a certificate authority made for a test.
type CA struct {
	File string // the CA certificate, PEM
	Pool *x509.CertPool

	dir  string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// Set is a CA with one server and one client certificate, the usual needs of
// a TLS test. The server certificate is also valid for client
// authentication: Redis presents it when it connects to other servers
// (replication, cluster bus, Sentinel).
type Set struct {
	CA                    *CA
	ServerCert, ServerKey string
	ClientCert, ClientKey string
}

// New makes a CA and a server and a client certificate signed by it.
func New(t testing.TB) *Set {
	t.Helper()
	ca := NewCA(t)
	s := &Set{CA: ca}
	s.ServerCert, s.ServerKey = ca.Issue(t, "server", true)
	s.ClientCert, s.ClientKey = ca.Issue(t, "client", false)
	return s
}

// ClientTLS returns a client configuration that trusts the CA and presents
// the client certificate.
func (s *Set) ClientTLS(t testing.TB) *tls.Config {
	t.Helper()
	c, err := tls.LoadX509KeyPair(s.ClientCert, s.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{RootCAs: s.CA.Pool, Certificates: []tls.Certificate{c}, MinVersion: tls.VersionTLS12}
}

// NewCA makes a CA in a fresh temporary directory.
func NewCA(t testing.TB) *CA {
	t.Helper()
	key := newKey(t)
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: "sluice test CA " + t.Name()},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(Validity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	ca := &CA{dir: t.TempDir(), cert: cert, key: key, Pool: x509.NewCertPool()}
	ca.Pool.AddCert(cert)
	ca.File = filepath.Join(ca.dir, "ca.crt")
	writePEM(t, ca.File, "CERTIFICATE", der)
	return ca
}

// Issue writes a certificate named name signed by the CA, and its key, as
// name.crt and name.key in the CA's directory (replacing earlier ones), and
// returns their paths. A server certificate holds 127.0.0.1, ::1 and
// ServerNames and is valid for server and client authentication; a client
// certificate only for client authentication, with name as its common name.
func (ca *CA) Issue(t testing.TB, name string, server bool) (certFile, keyFile string) {
	t.Helper()
	usages := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	if server {
		usages = append(usages, x509.ExtKeyUsageServerAuth)
	}
	return ca.issue(t, name, server, usages)
}

// IssueServerOnly is Issue for a server certificate valid for server
// authentication only: one a client must not be able to authenticate with.
func (ca *CA) IssueServerOnly(t testing.TB, name string) (certFile, keyFile string) {
	t.Helper()
	return ca.issue(t, name, true, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth})
}

// issue is Issue with the certificate's extended key usages.
func (ca *CA) issue(t testing.TB, name string, server bool, usages []x509.ExtKeyUsage) (certFile, keyFile string) {
	t.Helper()
	key := newKey(t)
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(Validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  usages,
	}
	if server {
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
		tmpl.DNSNames = ServerNames
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(ca.dir, name+".crt"), filepath.Join(ca.dir, name+".key")
	writePEM(t, keyFile, "PRIVATE KEY", keyDER)
	writePEM(t, certFile, "CERTIFICATE", der)
	return certFile, keyFile
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func serial(t testing.TB) *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// writePEM writes one PEM block to path through a rename, so that a reader
// never sees half a file.
func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}
