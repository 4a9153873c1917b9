package stack

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis is a redis-server process started by StartRedis, for programs
// (tests use internal/redistest).
type Redis struct {
	addr string
	cmd  *exec.Cmd
	done chan struct{}
}

// StartRedis starts redis-server from PATH on a 127.0.0.1 port from FreePort,
// persisting nothing, logging to dir/redis.log, and returns once it answers
// PING.
func StartRedis(ctx context.Context, dir string) (*Redis, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server is not on PATH: %w", err)
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	r := &Redis{addr: "127.0.0.1:" + strconv.Itoa(port), done: make(chan struct{})}
	logPath := filepath.Join(dir, "redis.log")
	r.cmd = exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--logfile", logPath)
	if err := startChild(r.cmd); err != nil {
		return nil, fmt.Errorf("start redis-server: %w", err)
	}
	go func() {
		r.cmd.Wait()
		close(r.done)
	}()
	client := redis.NewClient(&redis.Options{Addr: r.addr, MaxRetries: -1})
	defer client.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		err := client.Ping(pctx).Err()
		cancel()
		if err == nil {
			return r, nil
		}
		select {
		case <-r.done:
			return nil, fmt.Errorf("redis-server exited (%v); log %s:\n%s", r.cmd.ProcessState, logPath, tail(logPath, 0))
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			r.Stop()
			return nil, errors.Join(fmt.Errorf("redis-server on %s does not answer PING", r.addr), err, ctx.Err())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Addr returns the server's address, 127.0.0.1:port.
func (r *Redis) Addr() string { return r.addr }

// Stop ends the server: SIGTERM, then SIGKILL after a few seconds.
func (r *Redis) Stop() {
	if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		r.cmd.Process.Kill()
	}
	select {
	case <-r.done:
	case <-time.After(5 * time.Second):
		r.cmd.Process.Kill()
		<-r.done
	}
}

// PID returns the server's process id.
func (r *Redis) PID() int { return r.cmd.Process.Pid }

// FlushAll empties the server.
func (r *Redis) FlushAll(ctx context.Context) error {
	client := redis.NewClient(&redis.Options{Addr: r.addr})
	defer client.Close()
	return client.FlushAll(ctx).Err()
}
