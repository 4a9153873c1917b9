package portlock

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The test binary doubles as a helper process that holds or probes a lock: TestMain runs the helper
// instead of the tests when helperEnv is set.
const (
	helperEnv     = "PORTLOCK_TEST_HELPER" // "hold" or "try"
	helperDirEnv  = "PORTLOCK_TEST_DIR"    // the lock directory
	helperPortEnv = "PORTLOCK_TEST_PORT"   // the port whose lock the helper takes
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(helper(mode))
	}
	os.Exit(m.Run())
}

// helper takes the lock of $PORTLOCK_TEST_PORT in $PORTLOCK_TEST_DIR and prints "locked" or
// "busy". In mode "hold" it then keeps the lock until its standard input closes.
func helper(mode string) int {
	port, err := strconv.Atoi(os.Getenv(helperPortEnv))
	if err != nil {
		fmt.Println("bad port:", err)
		return 2
	}
	r := newReserver(os.Getenv(helperDirEnv), port, port)
	f, err := r.tryLock(port)
	switch {
	case errors.Is(err, errBusy):
		fmt.Println("busy")
		return 0
	case err != nil:
		fmt.Println("error:", err)
		return 2
	}
	fmt.Println("locked")
	if mode == "hold" {
		io.Copy(io.Discard, os.Stdin)
	}
	f.Close()
	return 0
}

// startHelper runs the helper process in mode for port's lock in dir and returns its first line
// of output and a function that closes its standard input and waits for it to exit.
func startHelper(t *testing.T, mode, dir string, port int) (string, func()) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode, helperDirEnv+"="+dir, helperPortEnv+"="+strconv.Itoa(port),
		"GORACE=atexit_sleep_ms=0") // under -race, exit at once instead of after a second
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stop := func() {
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("helper %s: %v", mode, err)
		}
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		stop()
		t.Fatalf("helper %s: reading its output: %v", mode, err)
	}
	return strings.TrimSpace(line), stop
}

// probe reports what another process finds when it tries port's lock in dir: "locked" (it got
// the lock, so nobody held it) or "busy".
func probe(t *testing.T, dir string, port int) string {
	t.Helper()
	got, stop := startHelper(t, "try", dir, port)
	stop()
	return got
}

// fakeReserver returns a reserver of first-last in a fresh directory that starts at first and
// treats every port as bindable, so that only the locks decide.
func fakeReserver(t *testing.T, first, last int) *reserver {
	r := newReserver(t.TempDir(), first, last)
	r.start = func(int) int { return 0 }
	r.bindable = func(int) bool { return true }
	return r
}

func TestParseRange(t *testing.T) {
	tests := []struct {
		in      string
		lo, hi  int
		wantErr string
	}{
		{"32768\t60999\n", 32768, 60999, ""},
		{"1024 65535", 1024, 65535, ""},
		{"40000 40000", 40000, 40000, ""},
		{"", 0, 0, "want two numbers"},
		{"32768", 0, 0, "want two numbers"},
		{"1 2 3", 0, 0, "want two numbers"},
		{"x 60999", 0, 0, "low bound"},
		{"32768 y", 0, 0, "high bound"},
		{"60999 32768", 0, 0, "low <= high"},
		{"0 100", 0, 0, "low <= high"},
		{"1024 70000", 0, 0, "low <= high"},
	}
	for _, tc := range tests {
		lo, hi, err := parseRange(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("parseRange(%q) = %d, %d, %v; want error %q", tc.in, lo, hi, err, tc.wantErr)
			}
			continue
		}
		if err != nil || lo != tc.lo || hi != tc.hi {
			t.Errorf("parseRange(%q) = %d, %d, %v; want %d, %d", tc.in, lo, hi, err, tc.lo, tc.hi)
		}
	}
}

func TestCandidates(t *testing.T) {
	tests := []struct {
		lo, hi, first, last int
	}{
		{32768, 60999, 10000, 32767}, // Linux default: below the range
		{49152, 65535, 10000, 49151}, // IANA range
		{11000, 60999, 10000, 10999}, // exactly enough below
		{10999, 60999, 61000, 65535}, // too few below: above
		{10500, 65000, 1024, 10499},  // too few below 10000's side and above: from 1024
		{1500, 64600, 10000, 65535},  // nearly everything is ephemeral: locks only
		{1024, 65535, 10000, 65535},
	}
	for _, tc := range tests {
		first, last := candidates(tc.lo, tc.hi)
		if first != tc.first || last != tc.last {
			t.Errorf("candidates(%d, %d) = %d-%d, want %d-%d", tc.lo, tc.hi, first, last, tc.first, tc.last)
		}
		if first < lowestOK || last > highest || last-first+1 < minSpan {
			t.Errorf("candidates(%d, %d) = %d-%d: not %d usable ports", tc.lo, tc.hi, first, last, minSpan)
		}
	}
}

func TestReserveDistinctPorts(t *testing.T) {
	first, last := candidates(ephemeralRange())
	r := newReserver(t.TempDir(), first, last)
	seen := map[int]bool{}
	for range 100 {
		port, err := r.reserve()
		if err != nil {
			t.Fatal(err)
		}
		if seen[port] {
			t.Fatalf("port %d reserved twice", port)
		}
		seen[port] = true
		if port < first || port > last {
			t.Errorf("port %d outside the candidates %d-%d", port, first, last)
		}
	}
}

func TestReserveExhausted(t *testing.T) {
	r := fakeReserver(t, 20000, 20002)
	for want := 20000; want <= 20002; want++ {
		if got, err := r.reserve(); err != nil || got != want {
			t.Fatalf("reserve = %d, %v; want %d", got, err, want)
		}
	}
	_, err := r.reserve()
	if err == nil || !strings.Contains(err.Error(), "20000-20002") || !strings.Contains(err.Error(), r.dir) {
		t.Errorf("reserve with every port taken: %v, want an error naming the range and %s", err, r.dir)
	}
}

func TestReserveSkipsPortLockedByAnotherProcess(t *testing.T) {
	r := fakeReserver(t, 20000, 20002)
	got, stop := startHelper(t, "hold", r.dir, 20000)
	if got != "locked" {
		stop()
		t.Fatalf("helper holding port 20000 says %q, want locked", got)
	}
	port, err := r.reserve()
	if err != nil || port != 20001 {
		t.Errorf("reserve while another process holds 20000 = %d, %v; want 20001", port, err)
	}
	stop()
	// Once the other process is gone, its port is free again.
	if port, err := r.reserve(); err != nil || port != 20000 {
		t.Errorf("reserve after the other process exited = %d, %v; want 20000", port, err)
	}
}

func TestReserveSkipsUnbindablePort(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	taken := l.Addr().(*net.TCPAddr).Port
	r := newReserver(t.TempDir(), taken, taken)
	if port, err := r.reserve(); err == nil {
		t.Fatalf("reserve of a port with a listener = %d, want an error", port)
	}
	// The lock taken while checking the port was let go.
	if got := probe(t, r.dir, taken); got != "locked" {
		t.Errorf("another process trying the lock of the skipped port %d: %q, want locked", taken, got)
	}
	l.Close()
	if port, err := r.reserve(); err != nil || port != taken {
		t.Errorf("reserve after the listener closed = %d, %v; want %d", port, err, taken)
	}
}

func TestLockSurvivesListenerClose(t *testing.T) {
	first, last := candidates(ephemeralRange())
	r := newReserver(t.TempDir(), first, last)
	port, err := r.reserve()
	if err != nil {
		t.Fatal(err)
	}
	// A server comes and goes on the port, as a killed redis-server would.
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatalf("listen on reserved port %d: %v", port, err)
	}
	l.Close()
	if got := probe(t, r.dir, port); got != "busy" {
		t.Errorf("another process trying the lock of port %d after the listener closed: %q, want busy", port, got)
	}
	other := newReserver(r.dir, port, port)
	if p, err := other.reserve(); err == nil {
		t.Errorf("a second reserver got the reserved port %d", p)
	}
	if _, err := os.Stat(lockPath(r.dir, port)); err != nil {
		t.Errorf("lock file: %v", err)
	}
}

func TestReserve(t *testing.T) {
	lo, hi := ephemeralRange()
	first, last := candidates(lo, hi)
	a, err := Reserve()
	if err != nil {
		t.Fatal(err)
	}
	b, err := Reserve()
	if err != nil {
		t.Fatal(err)
	}
	if a == b {
		t.Errorf("Reserve twice = %d both times", a)
	}
	dir := filepath.Join(os.TempDir(), dirName)
	for _, p := range []int{a, b} {
		if p < first || p > last {
			t.Errorf("Reserve = %d, outside the candidates %d-%d", p, first, last)
		}
		if first == minPort && p >= lo && p <= hi {
			t.Errorf("Reserve = %d, inside the ephemeral range %d-%d", p, lo, hi)
		}
		if got := probe(t, dir, p); got != "busy" {
			t.Errorf("another process trying the lock of reserved port %d: %q, want busy", p, got)
		}
	}
	fi, err := os.Stat(dir)
	if err != nil || !fi.IsDir() {
		t.Fatalf("lock directory %s: %v", dir, err)
	}
}

func TestMakeDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "locks")
	if err := makeDir(dir); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o777 || fi.Mode()&os.ModeSticky == 0 {
		t.Errorf("lock directory mode = %v, want drwxrwxrwt", fi.Mode())
	}
	if err := makeDir(dir); err != nil {
		t.Errorf("makeDir of an existing directory: %v", err)
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := makeDir(filepath.Join(file, "locks")); err == nil || !strings.Contains(err.Error(), "lock directory") {
		t.Errorf("makeDir under a file: %v, want a lock directory error", err)
	}
}
