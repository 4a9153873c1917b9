package redistest

import (
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// StartSentinel starts redis-server in Sentinel mode on a reserved 127.0.0.1 port, monitoring
// master under masterName with a quorum of 1, and returns once it answers PING and monitors the
// master. The options are StartServer's; with WithTLS the Sentinel serves TLS and reaches the
// master over TLS (tls-replication). It is stopped when the test and its subtests end.
func StartSentinel(t testing.TB, masterName string, master *Server, opts ...Option) *Server {
	t.Helper()
	s, err := makeServer(t, false, opts)
	if err != nil {
		t.Fatalf("redistest: StartSentinel: %v", err)
	}
	// Sentinel needs a config file it can rewrite; it keeps what SENTINEL MONITOR adds.
	s.conf = filepath.Join(s.dir, "sentinel.conf")
	if err := os.WriteFile(s.conf, nil, 0o644); err != nil {
		t.Fatalf("redistest: StartSentinel: %v", err)
	}
	if err := s.startFresh(); err != nil {
		t.Fatalf("redistest: StartSentinel: %v", err)
	}
	host, port, _ := net.SplitHostPort(master.Addr())
	if _, err := s.command(time.Second, "SENTINEL", "MONITOR", masterName, host, port, "1"); err != nil {
		t.Fatalf("redistest: StartSentinel: SENTINEL MONITOR %s %s: %v", masterName, master.Addr(), err)
	}
	return s
}
