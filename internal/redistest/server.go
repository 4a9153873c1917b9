// Package redistest starts real redis-server processes for tests: a standalone server, a Redis
// Cluster of several masters, or a Sentinel; with WithTLS, over TLS only.
//
// Every server listens on a 127.0.0.1 port reserved with internal/portlock, keeps its files in the
// test's temporary directory, persists nothing (--save "" --appendonly no) and is stopped by PID
// when the test ends: SIGTERM, then SIGKILL if it has not exited within a few seconds. Kill and
// Restart let fault tests take a server away and bring it back on the same port; the reservation
// lasts as long as the test process, so no other process (another test package's server, a :0
// listener, an outgoing connection) takes the port while the server is down.
//
// The binary is $SLUICE_REDIS_SERVER if set, else redis-server from PATH. The project's tests run
// against real Redis, so a missing binary fails the test instead of skipping it.
package redistest

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/portlock"
	"github.com/sluicehq/sluice/internal/tlsfiles"
)

// EnvServer is the environment variable that can name the redis-server binary to use.
const EnvServer = "SLUICE_REDIS_SERVER"

const (
	startTimeout = 15 * time.Second              // how long a server may take to answer PING
	stopTimeout  = 5 * time.Second               // how long SIGTERM (then SIGKILL) may take to end a server
	pollInterval = 10 * time.Millisecond         // how often readiness is polled
	portAttempts = 5                             // fresh ports to try when a program that takes no port locks binds the first
	restartBind  = 2 * time.Second               // how long Restart retries a port that is still taken
	logTailLines = 15                            // lines of the server log quoted in errors
	logFileName  = "redis.log"                   // the server's log, in its directory
	readyLine    = "Ready to accept connections" // logged once the server listens
	sentinelUp   = "Sentinel ID is"              // logged once a Sentinel listens
)

// errPortInUse means redis-server could not listen because another process holds the port.
var errPortInUse = errors.New("port already in use")

// Option changes how StartServer and StartCluster run redis-server.
type Option func(*options)

// options collects what the Options set.
type options struct {
	args []string // extra redis-server arguments, appended after the package's own
	tls  *TLS     // serve TLS only
}

// WithArgs adds redis-server command-line arguments, for example WithArgs("--maxmemory", "10mb").
// They come after the package's own arguments, so they override them.
func WithArgs(args ...string) Option {
	return func(o *options) { o.args = append(o.args, args...) }
}

// TLS is what WithTLS gives a server: its certificate and key, and the CA whose client certificates it
// accepts. The certificate must also be valid for client authentication: the server presents it
// when it connects to other servers (replication, the cluster bus, a Sentinel to its master), and
// this package presents it for its own commands (PING, CLUSTER MEET).
type TLS struct {
	CAFile, CertFile, KeyFile string
}

// WithTLS serves TLS only, with tls-auth-clients yes: the server's port is its --tls-port, and its
// plaintext port is off (--port 0). Servers talk to each other over TLS too (tls-replication, and
// tls-cluster in a cluster).
func WithTLS(t TLS) Option {
	return func(o *options) { o.tls = &t }
}

// Binary returns the path of the redis-server binary the package runs: $SLUICE_REDIS_SERVER if set,
// else redis-server from PATH.
func Binary() (string, error) {
	if p := os.Getenv(EnvServer); p != "" {
		fi, err := os.Stat(p)
		if err != nil {
			return "", fmt.Errorf("%s=%s: %v", EnvServer, p, err)
		}
		if fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
			return "", fmt.Errorf("%s=%s: not an executable file", EnvServer, p)
		}
		return p, nil
	}
	p, err := exec.LookPath("redis-server")
	if err != nil {
		return "", fmt.Errorf("redis-server not found: run `make test`, which installs it, or set %s to a redis-server binary (%v)", EnvServer, err)
	}
	return p, nil
}

// Server is one redis-server process started for a test.
type Server struct {
	t       testing.TB
	bin     string              // the redis-server binary
	dir     string              // working directory: log, and nodes.conf in cluster mode
	extra   []string            // arguments from WithArgs
	tlsOpt  *TLS                // from WithTLS; nil: plaintext
	tlsCfg  *tls.Config         // the client side of tlsOpt, for the package's own commands
	cluster bool                // run with cluster-enabled yes
	conf    string              // config file given first (Sentinel), or ""
	pick    func() (int, error) // returns a port to try; portlock.Reserve outside tests

	mu      sync.Mutex
	port    int      // client port, fixed once the first start succeeds
	busPort int      // cluster bus port (cluster mode only), fixed likewise
	proc    *process // the running process, nil when stopped
}

// process is a started redis-server.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has exited and been reaped
}

// StartServer starts a standalone redis-server on a reserved 127.0.0.1 port and returns once it
// answers PING. The server is stopped when the test and its subtests end.
func StartServer(t testing.TB, opts ...Option) *Server {
	t.Helper()
	s, err := newServer(t, false, opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// newServer makes a Server, arranges for it to be stopped at the end of the test and starts it.
func newServer(t testing.TB, cluster bool, opts []Option) (*Server, error) {
	s, err := makeServer(t, cluster, opts)
	if err != nil {
		return nil, err
	}
	return s, s.startFresh()
}

// makeServer makes a Server and arranges for it to be stopped at the end of the test.
func makeServer(t testing.TB, cluster bool, opts []Option) (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	s := &Server{t: t, bin: bin, dir: t.TempDir(), extra: o.args, cluster: cluster, pick: portlock.Reserve, tlsOpt: o.tls}
	if o.tls != nil {
		pool, err := tlsfiles.CertPool(o.tls.CAFile)
		if err != nil {
			return nil, fmt.Errorf("WithTLS: %v", err)
		}
		cert, err := tls.LoadX509KeyPair(o.tls.CertFile, o.tls.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("WithTLS: %v", err)
		}
		s.tlsCfg = &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	t.Cleanup(func() {
		if err := s.stop(); err != nil {
			t.Errorf("redistest: %v", err)
		}
	})
	return s, nil
}

// Addr returns the server's address, "127.0.0.1:port". It stays the same across Restart.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
}

// PID returns the process ID of the running redis-server, or 0 if it is not running.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return 0
	}
	return s.proc.cmd.Process.Pid
}

// TLSConfig returns the client configuration the package's own commands use (trusting the CA of
// WithTLS and presenting its certificate), or nil without TLS.
func (s *Server) TLSConfig() *tls.Config {
	if s.tlsCfg == nil {
		return nil
	}
	return s.tlsCfg.Clone()
}

// command sends one command to the server (see the package function command).
func (s *Server) command(timeout time.Duration, args ...string) (string, error) {
	return commandTLS(s.Addr(), s.tlsCfg, timeout, args...)
}

// Dir returns the server's working directory (its log and, in cluster mode, nodes.conf).
func (s *Server) Dir() string { return s.dir }

// Kill ends the server with SIGKILL, as a crash would, and returns once the process is gone and
// the port is closed. Call it from the test's goroutine.
func (s *Server) Kill() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		s.t.Fatalf("redistest: Kill %s: the server is not running", s.addrLocked())
	}
	if err := s.proc.signalAndWait(syscall.SIGKILL, stopTimeout); err != nil {
		s.t.Fatalf("redistest: Kill %s: %v", s.addrLocked(), err)
	}
	s.proc = nil
}

// Restart starts the server again on the same port and directory and returns once it answers
// PING; a running server is stopped first (SIGTERM). No data survives, since nothing is persisted;
// a cluster node keeps its identity and slots through nodes.conf. Call it from the test's goroutine.
func (s *Server) Restart() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		if err := s.stopLocked(); err != nil {
			s.t.Fatalf("redistest: Restart: %v", err)
		}
	}
	deadline := time.Now().Add(restartBind)
	for {
		err := s.startLocked(s.port, s.busPort)
		if err == nil {
			return
		}
		if !errors.Is(err, errPortInUse) || time.Now().After(deadline) {
			s.t.Fatalf("redistest: Restart %s: %v", s.addrLocked(), err)
		}
		time.Sleep(50 * time.Millisecond) // another process holds the port: poll until it lets go
	}
}

// addrLocked is Addr for callers that hold s.mu.
func (s *Server) addrLocked() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
}

// startFresh starts the server on newly reserved ports, reserving again when a program that takes
// no port locks binds a port between the reservation and redis-server's bind.
func (s *Server) startFresh() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var err error
	for range portAttempts {
		var port, bus int
		if port, err = s.pick(); err != nil {
			return err
		}
		if s.cluster {
			if bus, err = s.pick(); err != nil {
				return err
			}
		}
		if err = s.startLocked(port, bus); !errors.Is(err, errPortInUse) {
			return err
		}
	}
	return fmt.Errorf("no free port after %d attempts: %w", portAttempts, err)
}

// startLocked starts redis-server on port (and busPort in cluster mode) and waits until it answers
// PING. On success the ports become the server's; on failure no process is left running.
func (s *Server) startLocked(port, busPort int) error {
	var args []string
	if s.conf != "" {
		args = append(args, s.conf, "--sentinel") // the config file must come first
	}
	if o := s.tlsOpt; o != nil {
		args = append(args, "--port", "0", "--tls-port", strconv.Itoa(port),
			"--tls-cert-file", o.CertFile, "--tls-key-file", o.KeyFile, "--tls-ca-cert-file", o.CAFile,
			"--tls-auth-clients", "yes", "--tls-replication", "yes")
		if s.cluster {
			args = append(args, "--tls-cluster", "yes")
		}
	} else {
		args = append(args, "--port", strconv.Itoa(port))
	}
	args = append(args,
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
		"--logfile", "", // log to stdout, which goes to redis.log
		"--enable-debug-command", "local", // DEBUG SLEEP etc. for slow-Redis tests
	)
	if s.cluster {
		args = append(args,
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-port", strconv.Itoa(busPort))
	}
	args = append(args, s.extra...)

	logPath := filepath.Join(s.dir, logFileName)
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	logStart, _ := logf.Seek(0, io.SeekEnd)
	cmd := exec.Command(s.bin, args...)
	cmd.Dir = s.dir
	cmd.Stdout = logf
	cmd.Stderr = logf
	err = startProcess(cmd)
	logf.Close() // the child has its own descriptor
	if err != nil {
		return fmt.Errorf("start %s: %v", s.bin, err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		cmd.Wait() // reaps the process; the exit status is read from cmd.ProcessState
		close(p.done)
	}()

	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	deadline := time.Now().Add(startTimeout)
	for {
		select {
		case <-p.done:
			tail := logTail(logPath, logStart)
			err := fmt.Errorf("redis-server on %s exited before answering PING (%v); log %s:\n%s", addr, cmd.ProcessState, logPath, tail)
			if strings.Contains(tail, "Address already in use") {
				err = fmt.Errorf("%w: %v", errPortInUse, err)
			}
			return err
		default:
		}
		// The log line proves that this process holds the port (redis-server binds before it
		// logs it); PING then shows it serves. PING alone could reach another process that holds
		// the port.
		ready := readyLine
		if s.conf != "" {
			ready = sentinelUp
		}
		if strings.Contains(logSince(logPath, logStart), ready) && pingOK(addr, s.tlsCfg) {
			s.port, s.busPort, s.proc = port, busPort, p
			return nil
		}
		if time.Now().After(deadline) {
			p.signalAndWait(syscall.SIGKILL, stopTimeout)
			return fmt.Errorf("redis-server on %s did not answer PING within %v; log %s:\n%s", addr, startTimeout, logPath, logTail(logPath, logStart))
		}
		select {
		case <-p.done:
		case <-time.After(pollInterval):
		}
	}
}

// pingOK reports whether the server at addr accepts commands. NOAUTH counts: the server is up and
// wants a password (set with WithArgs).
func pingOK(addr string, tc *tls.Config) bool {
	r, err := commandTLS(addr, tc, 500*time.Millisecond, "PING")
	var re replyError
	return (err == nil && r == "PONG") || (errors.As(err, &re) && strings.HasPrefix(string(re), "NOAUTH"))
}

// stop ends the server if it runs: SIGTERM, then SIGKILL.
func (s *Server) stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopLocked()
}

// stopLocked is stop for callers that hold s.mu.
func (s *Server) stopLocked() error {
	if s.proc == nil {
		return nil
	}
	err := s.proc.signalAndWait(syscall.SIGTERM, stopTimeout)
	if err != nil {
		err = s.proc.signalAndWait(syscall.SIGKILL, stopTimeout)
	}
	if err != nil {
		return fmt.Errorf("stop redis-server %s: %v", s.addrLocked(), err)
	}
	s.proc = nil
	return nil
}

// signalAndWait sends sig to the process and waits up to timeout for it to exit.
func (p *process) signalAndWait(sig syscall.Signal, timeout time.Duration) error {
	select {
	case <-p.done:
		return nil
	default:
	}
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signal pid %d: %v", p.cmd.Process.Pid, err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("pid %d still running %v after %v", p.cmd.Process.Pid, timeout, sig)
	}
}

// logSince returns the log written from offset from on ("" if it cannot be read).
func logSince(path string, from int64) string {
	b, err := os.ReadFile(path)
	if err != nil || from > int64(len(b)) {
		return ""
	}
	return string(b[from:])
}

// logTail returns the last lines of the log written from offset from on.
func logTail(path string, from int64) string {
	text := logSince(path, from)
	if text == "" {
		return "  (empty log)"
	}
	lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
	if len(lines) > logTailLines {
		lines = lines[len(lines)-logTailLines:]
	}
	return "  " + strings.Join(lines, "\n  ")
}
