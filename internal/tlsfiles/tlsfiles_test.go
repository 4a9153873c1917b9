package tlsfiles

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testcerts"
)

func TestKeyPairReload(t *testing.T) {
	ca := testcerts.NewCA(t)
	certFile, keyFile := ca.Issue(t, "server", true)
	k, err := LoadKeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	first, _ := k.Certificate()
	// Later modification times, as a rotation minutes later would have (the
	// file system's clock may not tick between two writes here).
	later := time.Now().Add(time.Minute)
	touch := func(files ...string) {
		for _, f := range files {
			if err := os.Chtimes(f, later, later); err != nil {
				t.Fatal(err)
			}
		}
		later = later.Add(time.Minute)
	}

	steps := []struct {
		name    string
		change  func()
		same    bool   // the pair in use stays the previous one
		wantErr string // in Err()
	}{
		{"unchanged", func() {}, true, ""},
		{"rotated", func() { ca.Issue(t, "server", true); touch(certFile, keyFile) }, false, ""},
		{"key half written", func() { os.WriteFile(keyFile, []byte("-----BEGIN PRIVATE KEY-----\n"), 0o600); touch(keyFile) }, true, "certificate"},
		{"key removed", func() { os.Remove(keyFile) }, true, "no such file"},
		{"rotated again", func() { ca.Issue(t, "server", true); touch(certFile, keyFile) }, false, ""},
	}
	prev := first
	for _, s := range steps {
		s.change()
		got, err := k.Certificate()
		if err != nil {
			t.Fatalf("%s: Certificate: %v (a pair loaded before must stay in use)", s.name, err)
		}
		if (got == prev) != s.same {
			t.Errorf("%s: pair in use changed = %v, want %v", s.name, got != prev, !s.same)
		}
		if e := k.Err(); (e == nil) != (s.wantErr == "") || e != nil && !strings.Contains(e.Error(), s.wantErr) {
			t.Errorf("%s: Err() = %v, want %q", s.name, e, s.wantErr)
		}
		prev = got
	}
}

func TestLoadErrors(t *testing.T) {
	ca := testcerts.NewCA(t)
	certFile, keyFile := ca.Issue(t, "client", false)
	big := filepath.Join(t.TempDir(), "big.pem")
	if err := os.WriteFile(big, make([]byte, MaxFileSize+1), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		err  func() error
		want string
	}{
		{"missing cert", func() error { _, err := LoadKeyPair(certFile+".x", keyFile); return err }, "no such file"},
		{"key for cert", func() error { _, err := LoadKeyPair(keyFile, keyFile); return err }, "certificate"},
		{"oversized", func() error { _, err := LoadKeyPair(big, keyFile); return err }, "more than"},
		{"CA not PEM", func() error { _, err := CertPool(keyFile); return err }, "no PEM certificate"},
		{"CA missing", func() error { _, err := CertPool(ca.File + ".x"); return err }, "CA file"},
	} {
		if err := tc.err(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
	if _, err := CertPool(ca.File); err != nil {
		t.Errorf("CertPool: %v", err)
	}
}
