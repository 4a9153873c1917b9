//go:build unix

package redisstore

import (
	"syscall"
	"testing"
	"time"
)

// processCPU returns this process's CPU time so far (user and system).
func processCPU(b *testing.B) time.Duration {
	b.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
