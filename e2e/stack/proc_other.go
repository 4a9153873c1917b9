//go:build !linux

package stack

import "os/exec"

// startChild starts cmd. Outside Linux there is no parent-death signal: a
// child outlives a parent that dies without stopping it.
func startChild(cmd *exec.Cmd) error { return cmd.Start() }

// processStopped cannot tell outside Linux: it assumes the signal took
// effect.
func processStopped(pid int) bool { return true }
