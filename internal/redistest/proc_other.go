//go:build !linux

package redistest

import "os/exec"

// startProcess starts cmd. Outside Linux there is no parent-death signal: a test binary that dies
// without running its cleanups leaves its redis-server processes behind.
func startProcess(cmd *exec.Cmd) error { return cmd.Start() }
