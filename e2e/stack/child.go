package stack

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// child is a process this package started (a control plane, Envoy): its
// command and a channel closed once it has exited and been reaped. A child
// may be started again (Restart), so its fields are guarded.
type child struct {
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited and been reaped
}

// run starts cmd with startChild and reaps it in the background, closing
// log once it exits. It returns the channel closed then.
func (c *child) run(cmd *exec.Cmd, log io.Closer) (<-chan struct{}, error) {
	if err := startChild(cmd); err != nil {
		log.Close()
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		log.Close()
		close(done)
	}()
	c.mu.Lock()
	c.cmd, c.done = cmd, done
	c.mu.Unlock()
	return done, nil
}

// PID returns the process ID, or 0 when the process is not running.
func (c *child) PID() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil || c.exited() {
		return 0
	}
	return c.cmd.Process.Pid
}

// exited reports whether the process has exited; c.mu must be held.
func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// signal sends sig to the process, if it runs.
func (c *child) signal(sig syscall.Signal) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil || c.exited() {
		return nil
	}
	if err := c.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signal %v to pid %d: %w", sig, c.cmd.Process.Pid, err)
	}
	return nil
}

// wait waits up to d for the process to exit and reports whether it did.
func (c *child) wait(d time.Duration) bool {
	c.mu.Lock()
	done := c.done
	c.mu.Unlock()
	if done == nil {
		return true
	}
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}
