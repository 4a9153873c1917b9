//go:build !unix

package portlock

import "os"

// openFlags are added when a lock file is opened: none outside Unix.
const openFlags = 0

// lockFile does nothing outside Unix, where there is no flock: the reserver's own record of its
// ports keeps them apart within the process, and nothing keeps them apart from other processes.
func lockFile(f *os.File) error { return nil }
