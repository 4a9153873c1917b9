package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/portlock"
)

// processGone reports whether no process has the given PID.
func processGone(pid int) bool {
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

// reachable reports whether something accepts TCP connections at addr.
func reachable(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// newClient returns a go-redis client for addr that fails fast instead of retrying.
func newClient(t *testing.T, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { c.Close() })
	return c
}

func TestServer(t *testing.T) {
	var pids []int
	t.Run("lifecycle", func(t *testing.T) {
		ctx := context.Background()
		start := time.Now()
		s := StartServer(t)
		t.Logf("standalone server ready in %v", time.Since(start))
		addr := s.Addr()
		if !strings.HasPrefix(addr, "127.0.0.1:") {
			t.Errorf("Addr = %q, want 127.0.0.1:port", addr)
		}
		pid := s.PID()
		if pid <= 0 || processGone(pid) {
			t.Fatalf("PID = %d, want a running process", pid)
		}
		pids = append(pids, pid)

		rdb := newClient(t, addr)
		if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if got, err := rdb.Get(ctx, "k").Result(); err != nil || got != "v" {
			t.Fatalf("GET k = %q, %v; want v", got, err)
		}
		// Nothing is persisted, and DEBUG is allowed from loopback.
		for param, want := range map[string]string{"save": "", "appendonly": "no", "bind": "127.0.0.1", "dir": s.Dir()} {
			got, err := rdb.ConfigGet(ctx, param).Result()
			if err != nil || got[param] != want {
				t.Errorf("CONFIG GET %s = %q, %v; want %q", param, got[param], err, want)
			}
		}
		if err := rdb.Do(ctx, "DEBUG", "SLEEP", "0").Err(); err != nil {
			t.Errorf("DEBUG SLEEP 0: %v", err)
		}

		s.Kill()
		if !processGone(pid) {
			t.Errorf("pid %d still exists after Kill", pid)
		}
		if s.PID() != 0 {
			t.Errorf("PID after Kill = %d, want 0", s.PID())
		}
		if reachable(addr) {
			t.Errorf("%s still accepts connections after Kill", addr)
		}
		if err := rdb.Ping(ctx).Err(); err == nil {
			t.Error("PING succeeded after Kill")
		}

		s.Restart()
		if s.Addr() != addr {
			t.Errorf("Addr after Restart = %s, want %s", s.Addr(), addr)
		}
		pid2 := s.PID()
		if pid2 <= 0 || pid2 == pid || processGone(pid2) {
			t.Fatalf("PID after Restart = %d (before %d), want a new running process", pid2, pid)
		}
		pids = append(pids, pid2)
		if err := rdb.Ping(ctx).Err(); err != nil {
			t.Fatalf("PING after Restart: %v", err)
		}
		if n, err := rdb.Exists(ctx, "k").Result(); err != nil || n != 0 {
			t.Errorf("EXISTS k after Restart = %d, %v; want 0 (nothing persisted)", n, err)
		}

		// Restart of a running server stops it first.
		s.Restart()
		pid3 := s.PID()
		if !processGone(pid2) || pid3 == pid2 || processGone(pid3) {
			t.Errorf("Restart of a running server: old pid %d gone=%v, new pid %d", pid2, processGone(pid2), pid3)
		}
		pids = append(pids, pid3)
		if err := rdb.Ping(ctx).Err(); err != nil {
			t.Fatalf("PING after second Restart: %v", err)
		}
	})
	for _, pid := range pids {
		if !processGone(pid) {
			t.Errorf("pid %d still running after the test's cleanup", pid)
		}
	}
	if len(pids) != 3 {
		t.Errorf("recorded %d pids, want 3", len(pids))
	}
}

func TestServerWithArgs(t *testing.T) {
	s := StartServer(t, WithArgs("--requirepass", "secret", "--maxmemory", "10mb"))
	ctx := context.Background()
	if err := newClient(t, s.Addr()).Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), "NOAUTH") {
		t.Errorf("PING without password = %v, want NOAUTH", err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr(), Password: "secret", MaxRetries: -1})
	defer rdb.Close()
	got, err := rdb.ConfigGet(ctx, "maxmemory").Result()
	if err != nil || got["maxmemory"] != strconv.Itoa(10<<20) {
		t.Errorf("CONFIG GET maxmemory = %v, %v; want %d", got, err, 10<<20)
	}
}

func TestCluster(t *testing.T) {
	var pids []int
	t.Run("three masters", func(t *testing.T) {
		ctx := context.Background()
		start := time.Now()
		c := StartCluster(t, 3)
		t.Logf("3-master cluster ready in %v", time.Since(start))
		addrs := c.Addrs()
		if len(addrs) != 3 {
			t.Fatalf("Addrs = %v, want 3", addrs)
		}
		for _, s := range c.Nodes() {
			pids = append(pids, s.PID())
			if _, err := os.Stat(filepath.Join(s.Dir(), "nodes.conf")); err != nil {
				t.Errorf("node %s: %v", s.Addr(), err)
			}
		}

		cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, MaxRetries: 2})
		defer cc.Close()
		// Keys in every third of the slot space, so that each master serves some.
		const n = 300
		for i := range n {
			key := fmt.Sprintf("key-%d", i)
			if err := cc.Set(ctx, key, i, 0).Err(); err != nil {
				t.Fatalf("SET %s: %v", key, err)
			}
		}
		for i := range n {
			key := fmt.Sprintf("key-%d", i)
			if got, err := cc.Get(ctx, key).Int(); err != nil || got != i {
				t.Fatalf("GET %s = %d, %v; want %d", key, got, err, i)
			}
		}
		// Every master holds some of the keys, and exactly the keys of its slots.
		total := 0
		for i, addr := range addrs {
			node := newClient(t, addr)
			size, err := node.DBSize(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			if size == 0 {
				t.Errorf("master %d (%s) holds no keys", i, addr)
			}
			total += int(size)
			slot, err := node.ClusterKeySlot(ctx, "key-0").Result()
			if err != nil {
				t.Fatal(err)
			}
			if lo, hi := int64(i*clusterSlots/3), int64((i+1)*clusterSlots/3-1); slot >= lo && slot <= hi {
				if v, err := node.Get(ctx, "key-0").Int(); err != nil || v != 0 {
					t.Errorf("master %d owns slot %d of key-0 but GET = %d, %v", i, slot, v, err)
				}
			}
		}
		if total != n {
			t.Errorf("masters hold %d keys in all, want %d", total, n)
		}

		// A master that crashes and restarts rejoins with its slots (from nodes.conf).
		victim := c.Nodes()[1]
		victim.Kill()
		start = time.Now()
		victim.Restart()
		c.WaitOK()
		t.Logf("killed master back and cluster ok in %v", time.Since(start))
		pids = append(pids, victim.PID())
		if err := cc.Set(ctx, "after-restart", 1, 0).Err(); err != nil {
			t.Errorf("SET after restart: %v", err)
		}
		for i := range n {
			key := fmt.Sprintf("key-%d", i)
			if err := cc.Set(ctx, key, i, 0).Err(); err != nil {
				t.Fatalf("SET %s after restart: %v", key, err)
			}
		}
	})
	if len(pids) != 4 {
		t.Errorf("recorded %d pids, want 4", len(pids))
	}
	for _, pid := range pids {
		if pid <= 0 || !processGone(pid) {
			t.Errorf("pid %d still running after the test's cleanup", pid)
		}
	}
}

func TestBinary(t *testing.T) {
	t.Run("from PATH", func(t *testing.T) {
		t.Setenv(EnvServer, "")
		p, err := Binary()
		if err != nil || filepath.Base(p) != "redis-server" {
			t.Errorf("Binary() = %q, %v; want redis-server from PATH", p, err)
		}
	})
	t.Run("missing from PATH", func(t *testing.T) {
		t.Setenv(EnvServer, "")
		t.Setenv("PATH", t.TempDir())
		_, err := Binary()
		if err == nil || !strings.Contains(err.Error(), "redis-server not found") || !strings.Contains(err.Error(), "make test") {
			t.Errorf("Binary() error = %v, want one that says redis-server is missing and to run make test", err)
		}
	})
	t.Run("env names a missing file", func(t *testing.T) {
		t.Setenv(EnvServer, filepath.Join(t.TempDir(), "nope"))
		_, err := Binary()
		if err == nil || !strings.Contains(err.Error(), EnvServer) {
			t.Errorf("Binary() error = %v, want one naming %s", err, EnvServer)
		}
	})
	t.Run("env names a file that is not executable", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "redis-server")
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Setenv(EnvServer, p)
		_, err := Binary()
		if err == nil || !strings.Contains(err.Error(), "not an executable") {
			t.Errorf("Binary() error = %v, want not an executable", err)
		}
	})
	t.Run("env names a real binary", func(t *testing.T) {
		t.Setenv(EnvServer, "")
		real, err := Binary()
		if err != nil {
			t.Fatal(err)
		}
		t.Setenv(EnvServer, real)
		s := StartServer(t)
		if err := newClient(t, s.Addr()).Ping(context.Background()).Err(); err != nil {
			t.Error(err)
		}
	})
}

func TestNotARedisServer(t *testing.T) {
	script := filepath.Join(t.TempDir(), "fake-redis")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho \"fake server refuses: $1 $2\"\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvServer, script)
	_, err := newServer(t, false, nil)
	if err == nil {
		t.Fatal("a binary that exits at once was accepted")
	}
	for _, want := range []string{"exited before answering PING", "exit status 3", "fake server refuses: --port"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q:\n%v", want, err)
		}
	}
}

func TestPortTakenIsRetried(t *testing.T) {
	// Hold a port and make it the first one the server tries: redis-server fails to bind, and
	// the server must move on to a fresh port.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	taken := l.Addr().(*net.TCPAddr).Port

	bin, err := Binary()
	if err != nil {
		t.Fatal(err)
	}
	picks := 0
	s := &Server{t: t, bin: bin, dir: t.TempDir(), pick: func() (int, error) {
		picks++
		if picks == 1 {
			return taken, nil
		}
		return portlock.Reserve()
	}}
	t.Cleanup(func() {
		if err := s.stop(); err != nil {
			t.Error(err)
		}
	})

	// The port-in-use failure itself is recognised.
	s.mu.Lock()
	err = s.startLocked(taken, 0)
	s.mu.Unlock()
	if !errors.Is(err, errPortInUse) {
		t.Fatalf("start on a taken port: %v, want errPortInUse", err)
	}

	if err := s.startFresh(); err != nil {
		t.Fatal(err)
	}
	if picks != 2 {
		t.Errorf("picked %d ports, want 2", picks)
	}
	if s.Addr() == net.JoinHostPort("127.0.0.1", strconv.Itoa(taken)) {
		t.Errorf("server claims the taken port %d", taken)
	}
	if err := newClient(t, s.Addr()).Ping(context.Background()).Err(); err != nil {
		t.Error(err)
	}
}

func TestParseInfo(t *testing.T) {
	m := parseInfo("cluster_state:ok\r\ncluster_slots_ok:16384\r\n\r\nodd line\r\nk:v:w\r\n")
	want := map[string]string{"cluster_state": "ok", "cluster_slots_ok": "16384", "k": "v:w"}
	if len(m) != len(want) {
		t.Errorf("parseInfo = %v, want %v", m, want)
	}
	for k, v := range want {
		if m[k] != v {
			t.Errorf("parseInfo[%q] = %q, want %q", k, m[k], v)
		}
	}
}

func TestReadReply(t *testing.T) {
	tests := []struct {
		in, want, wantErr string
	}{
		{"+PONG\r\n", "PONG", ""},
		{":42\r\n", "42", ""},
		{"$5\r\nhello\r\n", "hello", ""},
		{"$0\r\n\r\n", "", ""},
		{"$-1\r\n", "", ""},
		{"$12\r\nline1\r\nline2\r\n", "line1\r\nline2", ""},
		{"-ERR unknown command\r\n", "", "redis: ERR unknown command"},
		{"*1\r\n$1\r\na\r\n", "", "unsupported reply"},
		{"$x\r\n", "", "bad bulk length"},
		{"$10\r\nshort\r\n", "", "EOF"},
		{"\r\n", "", "empty reply"},
	}
	for _, tc := range tests {
		got, err := readReply(bufio.NewReader(strings.NewReader(tc.in)))
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("readReply(%q) = %q, %v; want error %q", tc.in, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("readReply(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}
