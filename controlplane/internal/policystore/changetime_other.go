//go:build !linux

package policystore

import (
	"os"
	"time"
)

// changeTime returns fi's modification time (the status change time is
// read on Linux only).
func changeTime(fi os.FileInfo) time.Time { return fi.ModTime() }
