package main

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/sluicehq/sluice/controlplane/policy"
)

// watchPolicies reports on changed each time what the -policy files hold
// differs from what it held at the previous tick: a file written, added or
// removed, or a Kubernetes ConfigMap update (which swaps the directory's
// ..data symlink and sends no signal). It is what envoyproxy/ratelimit's
// RUNTIME_WATCH_ROOT does for its runtime directory. Contents are compared,
// not modification times, so a touch reloads nothing; each file is read up
// to policy.MaxDocumentSize+1 bytes, the most a valid policy can be.
func watchPolicies(ctx context.Context, tick <-chan time.Time, paths []string, changed chan<- struct{}) {
	last := fingerprint(paths)
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
		}
		if f := fingerprint(paths); f != last {
			last = f
			select {
			case changed <- struct{}{}:
			default: // a reload is pending already; it reads the files anew
			}
		}
	}
}

// fingerprint hashes the names, sizes and contents of the policy files
// under paths. An unreadable path hashes as such, so that it coming back is
// a change too. Contents are read up to the most a valid set can hold
// (policy.MaxSetSize, plus one byte): past it the set is refused whatever
// it says, and a change that brings it back within the bound changes a size
// or a name.
func fingerprint(paths []string) [sha256.Size]byte {
	h := sha256.New()
	budget := int64(policy.MaxSetSize + 1)
	for _, p := range paths {
		names, err := policy.Files(p)
		if err != nil {
			io.WriteString(h, "\x00unreadable\x00"+p+"\x00")
			continue
		}
		slices.Sort(names)
		for _, n := range names {
			io.WriteString(h, "\x00file\x00"+n+"\x00")
			if st, err := os.Stat(n); err == nil {
				fmt.Fprintf(h, "%d\x00", st.Size())
			}
			if budget <= 0 {
				continue
			}
			if f, err := os.Open(n); err == nil {
				read, _ := io.Copy(h, io.LimitReader(f, min(policy.MaxDocumentSize+1, budget)))
				budget -= read
				f.Close()
			}
		}
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}
