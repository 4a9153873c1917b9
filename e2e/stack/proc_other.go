//go:build !linux

package stack

import (
	"os/exec"
	"time"
)

// startChild starts cmd. Outside Linux there is no parent-death signal: a
// child outlives a parent that dies without stopping it.
func startChild(cmd *exec.Cmd) error { return cmd.Start() }

// processStopped cannot tell outside Linux: it assumes the signal took
// effect.
func processStopped(pid int) bool { return true }

// procRSS is not measured outside Linux.
func procRSS(pid int) int64 { return 0 }

// ProcCPU is not measured outside Linux.
func ProcCPU(pid int) time.Duration { return 0 }
