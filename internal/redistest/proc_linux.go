package redistest

import (
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

// startRequest asks the starter thread to start a command.
type startRequest struct {
	cmd  *exec.Cmd
	done chan error
}

var (
	starterOnce sync.Once
	starter     chan startRequest
)

// startProcess starts cmd so that the kernel kills it (SIGKILL) if the test binary dies without
// running its cleanups, e.g. on a test timeout. Linux sends that signal when the thread that forked
// the child exits, so every child is forked from one goroutine locked to a thread that never exits.
func startProcess(cmd *exec.Cmd) error {
	starterOnce.Do(func() {
		starter = make(chan startRequest)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread lives as long as the process
			for r := range starter {
				r.done <- r.cmd.Start()
			}
		}()
	})
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	r := startRequest{cmd: cmd, done: make(chan error, 1)}
	starter <- r
	return <-r.done
}
