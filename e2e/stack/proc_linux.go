package stack

import (
	"bytes"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"sync"
	"syscall"
)

// forkRequest asks the forking thread to start a command.
type forkRequest struct {
	cmd  *exec.Cmd
	done chan error
}

var (
	forkerOnce sync.Once
	forker     chan forkRequest
)

// startChild starts cmd so that the kernel kills it (SIGKILL) when the
// process that started it dies without stopping it (a test timeout, a
// crash). Linux sends the parent-death signal when the thread that forked
// the child exits, so every child is forked from one goroutine locked to a
// thread that lives as long as the process.
func startChild(cmd *exec.Cmd) error {
	forkerOnce.Do(func() {
		forker = make(chan forkRequest)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread lives as long as the process
			for r := range forker {
				r.done <- r.cmd.Start()
			}
		}()
	})
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	r := forkRequest{cmd: cmd, done: make(chan error, 1)}
	forker <- r
	return <-r.done
}

// processStopped reports whether process pid is stopped by a signal (state
// T in /proc/pid/stat). A process that cannot be inspected counts as
// stopped: there is nothing to wait for.
func processStopped(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return true
	}
	return b[i+2] == 'T'
}
