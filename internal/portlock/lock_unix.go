//go:build unix

package portlock

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// openFlags are added when a lock file is opened: in a directory every user may write to, a
// symbolic link planted in place of a lock file is not followed.
const openFlags = syscall.O_NOFOLLOW

// lockFile takes an exclusive flock on f without waiting, or returns errBusy if another open file
// holds it (in this process or another). The lock lasts until f is closed or the process exits.
func lockFile(f *os.File) error {
	err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, syscall.EWOULDBLOCK):
		return errBusy
	default:
		return fmt.Errorf("flock %s: %v", f.Name(), err)
	}
}
