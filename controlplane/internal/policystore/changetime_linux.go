package policystore

import (
	"os"
	"syscall"
	"time"
)

// changeTime returns the later of fi's modification time and its status
// change time (ctime), which a write, a copy, a move or a touch sets to
// now and which nothing sets back.
func changeTime(fi os.FileInfo) time.Time {
	t := fi.ModTime()
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		if c := time.Unix(st.Ctim.Unix()); c.After(t) {
			t = c
		}
	}
	return t
}
