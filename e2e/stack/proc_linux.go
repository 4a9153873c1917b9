package stack

import (
	"bytes"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"
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

// procRSS returns the resident set size of process pid in bytes (VmRSS in
// /proc/pid/status), 0 when it cannot be read.
func procRSS(pid int) int64 {
	if pid <= 0 {
		return 0
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("VmRSS:")); ok {
			f := bytes.Fields(v)
			if len(f) == 0 {
				return 0
			}
			kb, _ := strconv.ParseInt(string(f[0]), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// ProcCPU returns the CPU time (user plus system) process pid has used, from
// /proc/pid/stat; 0 when it cannot be read.
func ProcCPU(pid int) time.Duration {
	if pid <= 0 {
		return 0
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	// After "pid (comm) ": state is field 3; utime and stime are fields 14 and 15.
	f := bytes.Fields(b[i+1:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(string(f[11]), 10, 64)
	st, _ := strconv.ParseInt(string(f[12]), 10, 64)
	return time.Duration(ut+st) * time.Second / clockTicks
}

// clockTicks is USER_HZ, the unit of /proc/pid/stat's times: 100 on every
// Linux architecture Go supports.
const clockTicks = 100
