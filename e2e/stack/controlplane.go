package stack

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/internal/portlock"
)

// Time limits of ControlPlane.
const (
	cpStartTimeout = 20 * time.Second // until /healthz answers
	cpStopTimeout  = 15 * time.Second // after SIGTERM, before SIGKILL
	portAttempts   = 5                // start attempts when a picked port was taken meanwhile
)

// ControlPlaneConfig configures a control-plane process.
type ControlPlaneConfig struct {
	// Binary is the sluice-controlplane executable.
	Binary string
	// Dir receives the process's log (controlplane-<grpc port>.log) and any
	// file it writes; it must exist.
	Dir string
	// RedisAddr is the Redis server (host:port); empty runs on the embedded
	// memory store.
	RedisAddr string
	// Policies are policy files (-policy), which own their domains; none
	// means the control plane's embedded example policies, which seed an
	// empty policy store.
	Policies []string
	// Token is the policy service's bearer token (passed as $SLUICE_TOKEN);
	// empty leaves the policy service off.
	Token string
	// Args are further command-line flags.
	Args []string
	// GRPCAddr, HTTPAddr and PolicyAddr are the listen addresses; empty
	// ones get 127.0.0.1 ports from FreePort, which stay reserved across
	// Kill and Restart.
	GRPCAddr, HTTPAddr, PolicyAddr string
	// Stderr, when set, also receives the process's log.
	Stderr io.Writer
}

// ControlPlane is one sluice-controlplane process.
type ControlPlane struct {
	cfg     ControlPlaneConfig
	logPath string

	child
}

// StartControlPlane starts a control plane and returns once it serves HTTP
// (/healthz answers 200). Listen addresses left empty get free ports.
func StartControlPlane(ctx context.Context, cfg ControlPlaneConfig) (*ControlPlane, error) {
	policies := make([]string, len(cfg.Policies))
	for i, p := range cfg.Policies {
		abs, err := filepath.Abs(p) // the process runs in cfg.Dir
		if err != nil {
			return nil, fmt.Errorf("control plane: policy %s: %w", p, err)
		}
		policies[i] = abs
	}
	cfg.Policies = policies
	var lastErr error
	for range portAttempts {
		c := &ControlPlane{cfg: cfg}
		picked := false
		for _, a := range []*string{&c.cfg.GRPCAddr, &c.cfg.HTTPAddr, &c.cfg.PolicyAddr} {
			if *a == "" {
				p, err := FreePort()
				if err != nil {
					return nil, err
				}
				*a = "127.0.0.1:" + strconv.Itoa(p)
				picked = true
			}
		}
		_, port, _ := net.SplitHostPort(c.cfg.GRPCAddr)
		c.logPath = filepath.Join(cfg.Dir, "controlplane-"+port+".log")
		err := c.start(ctx)
		if err == nil {
			return c, nil
		}
		lastErr = err
		if !picked || !strings.Contains(err.Error(), "address already in use") {
			return nil, err
		}
	}
	return nil, lastErr
}

// args returns the command line.
func (c *ControlPlane) args() []string {
	a := []string{
		"-grpc-addr", c.cfg.GRPCAddr,
		"-http-addr", c.cfg.HTTPAddr,
		"-log-format", "text",
	}
	if c.cfg.RedisAddr != "" {
		a = append(a, "-redis-addrs", c.cfg.RedisAddr)
	}
	for _, p := range c.cfg.Policies {
		a = append(a, "-policy", p)
	}
	a = append(a, "-policy-addr", c.cfg.PolicyAddr)
	return append(a, c.cfg.Args...)
}

// start runs the process and waits for /healthz.
func (c *ControlPlane) start(ctx context.Context) error {
	logf, err := os.OpenFile(c.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("control plane: %w", err)
	}
	from, _ := logf.Seek(0, io.SeekEnd)
	cmd := exec.Command(c.cfg.Binary, c.args()...)
	cmd.Dir = c.cfg.Dir
	// Its own process group: a Ctrl-C in the terminal reaches the parent,
	// which stops the control plane after the gateways that use it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out io.Writer = logf
	if c.cfg.Stderr != nil {
		out = io.MultiWriter(logf, c.cfg.Stderr)
	}
	cmd.Stdout, cmd.Stderr = out, out
	// Only what the control plane reads: no SLUICE_* setting leaks in from
	// the caller's environment.
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	if c.cfg.Token != "" {
		cmd.Env = append(cmd.Env, "SLUICE_TOKEN="+c.cfg.Token)
	}
	done, err := c.run(cmd, logf)
	if err != nil {
		return fmt.Errorf("control plane: start %s: %w", c.cfg.Binary, err)
	}

	deadline := time.Now().Add(cpStartTimeout)
	client := &http.Client{Timeout: time.Second}
	for {
		select {
		case <-done:
			return fmt.Errorf("control plane exited before serving (%v); log %s:\n%s", cmd.ProcessState, c.logPath, tail(c.logPath, from))
		case <-ctx.Done():
			c.Kill()
			return ctx.Err()
		default:
		}
		if status, _ := get(client, c.HTTPURL()+"/healthz"); status == http.StatusOK {
			return nil
		}
		if time.Now().After(deadline) {
			c.Kill()
			return fmt.Errorf("control plane did not serve /healthz within %v; log %s:\n%s", cpStartTimeout, c.logPath, tail(c.logPath, from))
		}
		select {
		case <-done:
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// GRPCAddr returns the decision API's address (host:port).
func (c *ControlPlane) GRPCAddr() string { return c.cfg.GRPCAddr }

// PolicyAddr returns the policy service's address (host:port).
func (c *ControlPlane) PolicyAddr() string { return c.cfg.PolicyAddr }

// HTTPURL returns the base URL of /metrics, /healthz and /readyz.
func (c *ControlPlane) HTTPURL() string { return "http://" + c.cfg.HTTPAddr }

// LogPath returns the file the process logs to.
func (c *ControlPlane) LogPath() string { return c.logPath }

// Ready reports whether /readyz answers 200, and its body.
func (c *ControlPlane) Ready() (bool, string) {
	status, body := get(&http.Client{Timeout: time.Second}, c.HTTPURL()+"/readyz")
	return status == http.StatusOK, body
}

// Signal sends sig to the process, if it runs.
func (c *ControlPlane) Signal(sig syscall.Signal) error {
	if err := c.signal(sig); err != nil {
		return fmt.Errorf("control plane: %w", err)
	}
	return nil
}

// Stop ends the process gracefully: SIGTERM (after SIGCONT, in case it was
// frozen), then SIGKILL if it has not exited within a few seconds. It returns
// once the process is gone.
func (c *ControlPlane) Stop() error {
	c.Signal(syscall.SIGCONT)
	if err := c.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	if c.wait(cpStopTimeout) {
		return nil
	}
	c.Kill()
	return fmt.Errorf("control plane did not exit within %v of SIGTERM: killed; log %s", cpStopTimeout, c.logPath)
}

// Kill ends the process with SIGKILL, as a crash would, and returns once it
// is gone.
func (c *ControlPlane) Kill() {
	c.Signal(syscall.SIGKILL)
	c.wait(cpStopTimeout)
}

// Freeze stops the process with SIGSTOP: its sockets stay open but nothing
// answers, as with a hung process or a network partition. It returns once
// the process is stopped. Thaw resumes it.
func (c *ControlPlane) Freeze() error {
	if err := c.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	pid := c.PID()
	deadline := time.Now().Add(5 * time.Second)
	for pid != 0 && !processStopped(pid) {
		if time.Now().After(deadline) {
			return fmt.Errorf("control plane pid %d not stopped 5s after SIGSTOP", pid)
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

// Thaw resumes a frozen process (SIGCONT).
func (c *ControlPlane) Thaw() error { return c.Signal(syscall.SIGCONT) }

// Restart starts the process again with the same configuration and
// addresses, after stopping it if it runs.
func (c *ControlPlane) Restart(ctx context.Context) error {
	if err := c.Stop(); err != nil {
		return err
	}
	return c.start(ctx)
}

// FreePort returns a TCP port that is free on 127.0.0.1 and reserved for this
// process until it exits (see internal/portlock): a process killed and
// restarted on the port finds it still unused, whatever else runs meanwhile.
func FreePort() (int, error) {
	return portlock.Reserve()
}

// get fetches url and returns the status code (0 on error) and body.
func get(client *http.Client, url string) (int, string) {
	resp, err := client.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, string(b)
}

// tail returns the last lines of the file written from offset from on.
func tail(path string, from int64) string {
	b, err := os.ReadFile(path)
	if err != nil || from > int64(len(b)) {
		return "(no log)"
	}
	lines := strings.Split(strings.TrimRight(string(b[from:]), "\n"), "\n")
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	return strings.Join(lines, "\n")
}
