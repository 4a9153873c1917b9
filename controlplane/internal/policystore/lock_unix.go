//go:build unix

package policystore

import (
	"os"
	"syscall"
)

// lockFile takes an exclusive advisory lock (flock) on path, creating the
// file if needed, and returns the function that releases it. The lock file
// itself is never removed: removing it would let two processes lock two
// different files.
func lockFile(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, unwrapPath(err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}
