package attackload

import (
	"syscall"
	"testing"
)

// RaiseOpenFiles raises the process's open-file limit to at least n (an
// attack of thousands of connections needs more than the usual 1,024), or
// skips the test when the hard limit does not allow it.
func RaiseOpenFiles(t testing.TB, n uint64) {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Skipf("getrlimit: %v", err)
	}
	if lim.Cur >= n {
		return
	}
	if lim.Max < n {
		t.Skipf("the open-file limit is %d, the attack needs %d", lim.Max, n)
	}
	lim.Cur = n
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Skipf("setrlimit: %v", err)
	}
}
