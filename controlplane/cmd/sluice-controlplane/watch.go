package main

import (
	"context"
	"crypto/sha256"
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

// fingerprint hashes the names and contents of the policy files under
// paths. An unreadable path hashes as such, so that it coming back is a
// change too.
func fingerprint(paths []string) [sha256.Size]byte {
	h := sha256.New()
	for _, p := range paths {
		names, err := policy.Files(p)
		if err != nil {
			io.WriteString(h, "\x00unreadable\x00"+p+"\x00")
			continue
		}
		slices.Sort(names)
		for _, n := range names {
			io.WriteString(h, "\x00file\x00"+n+"\x00")
			if f, err := os.Open(n); err == nil {
				io.Copy(h, io.LimitReader(f, policy.MaxDocumentSize+1))
				f.Close()
			}
		}
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}
