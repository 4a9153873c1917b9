//go:build !unix

package policystore

// lockFile is a no-op where flock is not available: writes are serialized
// within the process only, so one process at a time may write the file.
func lockFile(path string) (func(), error) { return func() {}, nil }
