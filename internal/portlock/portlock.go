// Package portlock reserves TCP ports on 127.0.0.1 for the lifetime of the calling process, across
// every process on the machine that reserves ports through it.
//
// Tests that kill a server and start it again on the same port need that port to stay unused in
// between. A port picked the usual way (listen on :0, note the port, close) is only free "a moment
// ago": once its server dies, the kernel may hand it to any other :0 listener or outgoing
// connection, for example in another test package that `go test ./...` runs in parallel, and the
// "dead" server then seems to answer.
//
// Reserve closes that gap with two rules:
//
//   - It picks ports outside the kernel's ephemeral range (net.ipv4.ip_local_port_range on Linux).
//     The kernel chooses ports for :0 listeners and for the local end of outgoing connections only
//     from that range, so nothing that lets the kernel choose can land on a reserved port.
//   - It takes an exclusive flock on a file named for the port in a directory shared by all
//     processes (os.TempDir()/sluice-ports/<port>.lock) and keeps the lock until the process exits;
//     the kernel drops it then, even after a crash or SIGKILL. Every process that reserves ports
//     here skips locked ports, and a reservation is never given back, so a killed server's port
//     cannot be reserved by anyone else while the process that reserved it lives.
//
// A candidate port must also be bindable on 127.0.0.1 when it is reserved, which skips ports that
// programs not using this package already listen on. Such a program could still bind a reserved
// port later; nothing short of holding the socket prevents that, and the servers these ports are
// for are separate processes that must bind it themselves.
//
// The candidates are 10000 up to the ephemeral range's low bound. If that leaves too few ports, the
// ports above the range are used, then 1024 up to the range; if the ephemeral range covers nearly
// everything, Reserve falls back to 10000-65535, where only the locks (not the kernel) keep ports
// apart. Outside Unix there is no flock: reservations are then kept apart within one process only.
package portlock

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

const (
	minPort   = 10000 // lowest candidate normally: below it are many well-known service ports
	minSpan   = 1000  // fewest candidates a range must offer to be used
	lowestOK  = 1024  // lowest candidate ever: ports below it need privileges
	highest   = 65535 // highest TCP port
	rangeFile = "/proc/sys/net/ipv4/ip_local_port_range"
	dirName   = "sluice-ports" // lock directory, in os.TempDir()
)

// Reserve returns a TCP port that is bindable on 127.0.0.1 now and that no other caller of
// Reserve, in this process or any other on the machine, gets while this process runs. The
// reservation lasts until the process exits; there is no way to give it back.
func Reserve() (int, error) {
	defaultOnce.Do(func() {
		first, last := candidates(ephemeralRange())
		defaultReserver = newReserver(filepath.Join(os.TempDir(), dirName), first, last)
	})
	return defaultReserver.reserve()
}

var (
	defaultOnce     sync.Once
	defaultReserver *reserver // the process's reserver, made on first use
)

// reserver hands out ports from one candidate range, locking them in one directory.
type reserver struct {
	dir         string               // where the lock files live
	first, last int                  // candidate ports, inclusive
	start       func(n int) int      // offset in [0, n) of the first candidate tried
	bindable    func(port int) bool  // whether 127.0.0.1:port can be bound now
	lock        func(*os.File) error // takes the file's lock; errBusy if another holder has it

	mu   sync.Mutex
	held map[int]*os.File // ports reserved by this reserver; the open files keep their locks
}

// errBusy means another open file holds a port's lock.
var errBusy = errors.New("port lock held elsewhere")

// newReserver returns a reserver of the ports first to last that locks them in dir.
func newReserver(dir string, first, last int) *reserver {
	return &reserver{
		dir:      dir,
		first:    first,
		last:     last,
		start:    rand.IntN,
		bindable: bindable,
		lock:     lockFile,
		held:     map[int]*os.File{},
	}
}

// reserve tries every candidate once, from a random one on, and returns the first it can lock
// and bind.
func (r *reserver) reserve() (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := makeDir(r.dir); err != nil {
		return 0, err
	}
	n := r.last - r.first + 1
	off := r.start(n)
	var lastErr error // the last failure that was not an ordinary busy port
	for i := range n {
		port := r.first + (off+i)%n
		if _, ok := r.held[port]; ok {
			continue
		}
		f, err := r.tryLock(port)
		if err != nil {
			if !errors.Is(err, errBusy) {
				lastErr = err
			}
			continue
		}
		if !r.bindable(port) {
			f.Close() // in use by a program that takes no locks: let it go again
			continue
		}
		r.held[port] = f
		return port, nil
	}
	err := fmt.Errorf("portlock: no port in %d-%d is free and unreserved (lock directory %s)", r.first, r.last, r.dir)
	if lastErr != nil {
		err = fmt.Errorf("%w; last error: %v", err, lastErr)
	}
	return 0, err
}

// tryLock opens port's lock file and takes its lock without waiting. On success the returned
// file holds the lock until it is closed.
func (r *reserver) tryLock(port int) (*os.File, error) {
	// Read-only is enough for flock, and lets a process open a file another user created.
	f, err := os.OpenFile(lockPath(r.dir, port), os.O_RDONLY|os.O_CREATE|openFlags, 0o644)
	if err != nil {
		return nil, err
	}
	if err := r.lock(f); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// lockPath returns the lock file of port in dir.
func lockPath(dir string, port int) string {
	return filepath.Join(dir, strconv.Itoa(port)+".lock")
}

// makeDir creates the lock directory if it is missing, writable by every user with the sticky bit
// (like /tmp), so that the test runs of several users on one machine share it.
func makeDir(dir string) error {
	err := os.Mkdir(dir, 0o777)
	switch {
	case err == nil:
		if err := os.Chmod(dir, 0o777|os.ModeSticky); err != nil {
			return fmt.Errorf("portlock: lock directory: %v", err)
		}
		return nil
	case errors.Is(err, os.ErrExist):
		return nil
	default:
		return fmt.Errorf("portlock: lock directory: %v", err)
	}
}

// bindable reports whether a TCP listener can be opened on 127.0.0.1:port now.
func bindable(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// ephemeralRange returns the kernel's ephemeral port range. Where it cannot be read (not Linux),
// it returns 32768-65535, which covers both Linux's default (32768-60999) and the IANA range
// (49152-65535) that other systems use.
func ephemeralRange() (lo, hi int) {
	b, err := os.ReadFile(rangeFile)
	if err != nil {
		return 32768, highest
	}
	lo, hi, err = parseRange(string(b))
	if err != nil {
		return 32768, highest
	}
	return lo, hi
}

// parseRange parses the contents of ip_local_port_range: two port numbers separated by white space,
// low first.
func parseRange(s string) (lo, hi int, err error) {
	f := strings.Fields(s)
	if len(f) != 2 {
		return 0, 0, fmt.Errorf("port range %q: want two numbers", s)
	}
	if lo, err = strconv.Atoi(f[0]); err != nil {
		return 0, 0, fmt.Errorf("port range %q: low bound: %v", s, err)
	}
	if hi, err = strconv.Atoi(f[1]); err != nil {
		return 0, 0, fmt.Errorf("port range %q: high bound: %v", s, err)
	}
	if lo < 1 || hi > highest || lo > hi {
		return 0, 0, fmt.Errorf("port range %q: want 1 <= low <= high <= %d", s, highest)
	}
	return lo, hi, nil
}

// candidates returns the ports Reserve picks from, given the ephemeral range lo-hi: 10000 up to lo
// if that offers enough ports, else the ports above hi, else 1024 up to lo, else 10000-65535.
func candidates(lo, hi int) (first, last int) {
	switch {
	case lo-minPort >= minSpan:
		return minPort, lo - 1
	case highest-hi >= minSpan:
		return hi + 1, highest
	case lo-lowestOK >= minSpan:
		return lowestOK, lo - 1
	default:
		return minPort, highest
	}
}
