// Package tlsfiles reads TLS certificates, keys and CA bundles from PEM
// files, and serves a key pair that follows its files when they are rotated
// on disk (a renewed certificate, a Kubernetes secret update), without a
// restart.
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"sync"
	"time"
)

// MaxFileSize bounds what the package reads from one file: PEM bundles are
// kilobytes, and a path that names something else must not be read whole.
const MaxFileSize = 1 << 20

// readFile reads a file of at most MaxFileSize bytes.
func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if fi.Size() > MaxFileSize {
		return nil, fmt.Errorf("%s: %d bytes, more than the %d a PEM file may have", path, fi.Size(), MaxFileSize)
	}
	b := make([]byte, fi.Size())
	if _, err := f.ReadAt(b, 0); err != nil && fi.Size() > 0 {
		return nil, err
	}
	return b, nil
}

// CertPool reads the PEM certificates of a CA bundle.
func CertPool(file string) (*x509.CertPool, error) {
	data, err := readFile(file)
	if err != nil {
		return nil, fmt.Errorf("CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("CA file %s: no PEM certificate in it", file)
	}
	return pool, nil
}

// KeyPair is a certificate and its private key read from two PEM files. It
// reads them again when either file's size or modification time changes
// (checked on every handshake, which costs two stat calls); a pair that
// fails to load (a file half written, a key that does not match) leaves the
// last good one in use until the files are right. Safe for concurrent use.
type KeyPair struct {
	certFile, keyFile string

	mu        sync.Mutex
	cert      *tls.Certificate
	certStamp stamp
	keyStamp  stamp
	lastErr   error // why the files on disk were not taken, if they were not
}

// stamp identifies a version of a file.
type stamp struct {
	size int64
	mod  time.Time
}

// LoadKeyPair reads the pair; an error names the files and why.
func LoadKeyPair(certFile, keyFile string) (*KeyPair, error) {
	k := &KeyPair{certFile: certFile, keyFile: keyFile}
	if _, err := k.Certificate(); err != nil {
		return nil, err
	}
	return k, nil
}

// Certificate returns the pair, reloaded first if a file changed. It fails
// only when no pair has ever loaded.
func (k *KeyPair) Certificate() (*tls.Certificate, error) {
	cs, cerr := fileStamp(k.certFile)
	ks, kerr := fileStamp(k.keyFile)
	k.mu.Lock()
	defer k.mu.Unlock()
	if cerr == nil && kerr == nil && k.cert != nil && cs == k.certStamp && ks == k.keyStamp {
		return k.cert, nil
	}
	err := cerr
	if err == nil {
		err = kerr
	}
	if err == nil {
		var c tls.Certificate
		if c, err = loadPair(k.certFile, k.keyFile); err == nil {
			k.cert, k.certStamp, k.keyStamp, k.lastErr = &c, cs, ks, nil
			return k.cert, nil
		}
	}
	k.lastErr = fmt.Errorf("certificate %s / key %s: %w", k.certFile, k.keyFile, err)
	if k.cert == nil {
		return nil, k.lastErr
	}
	return k.cert, nil
}

// Err returns why the files on disk are not the pair in use (a failed
// reload), or nil.
func (k *KeyPair) Err() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.lastErr
}

// GetCertificate is for tls.Config.GetCertificate (a server's certificate).
func (k *KeyPair) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return k.Certificate()
}

// GetClientCertificate is for tls.Config.GetClientCertificate (a client's
// certificate).
func (k *KeyPair) GetClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return k.Certificate()
}

// fileStamp returns the size and modification time of path (following
// symbolic links, as a Kubernetes secret volume needs).
func fileStamp(path string) (stamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return stamp{}, err
	}
	return stamp{fi.Size(), fi.ModTime()}, nil
}

// loadPair parses a certificate chain and its key.
func loadPair(certFile, keyFile string) (tls.Certificate, error) {
	certPEM, err := readFile(certFile)
	if err != nil {
		return tls.Certificate{}, err
	}
	keyPEM, err := readFile(keyFile)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.X509KeyPair(certPEM, keyPEM)
}
