package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/controlplane/policy"
	"github.com/sluicehq/sluice/e2e/stack"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestWriteLowered checks the file the banner's ratectl line applies: the
// example policy with only the per-address limit changed.
func TestWriteLowered(t *testing.T) {
	example := filepath.Join("..", "..", "..", "controlplane", "policy", "example.yaml")
	out := filepath.Join(t.TempDir(), "lowered.yaml")
	if err := writeLowered(example, out, 3); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	lowered, err := policy.Parse(out, b)
	if err != nil {
		t.Fatal(err)
	}
	src, _ := os.ReadFile(example)
	orig, err := policy.Parse(example, src)
	if err != nil {
		t.Fatal(err)
	}
	if lowered.Name != orig.Name || len(lowered.Descriptors) != len(orig.Descriptors) {
		t.Fatalf("domain %q with %d descriptors, want %q with %d", lowered.Name, len(lowered.Descriptors), orig.Name, len(orig.Descriptors))
	}
	for i, d := range lowered.Descriptors {
		o := orig.Descriptors[i]
		for j, l := range d.Limits {
			want := o.Limits[j].Requests
			if d.Key == "remote_address" {
				want = 3
			}
			if l.Requests != want || l.Window != o.Limits[j].Window || l.Algorithm != o.Limits[j].Algorithm {
				t.Errorf("%s limit %d: %d per %v (%s), want %d per %v (%s)", d.Path, j, l.Requests, l.Window, l.Algorithm,
					want, o.Limits[j].Window, o.Limits[j].Algorithm)
			}
		}
	}
	if !strings.Contains(string(b), "# Every client address") {
		t.Error("the comments of the example were lost")
	}
}

func TestParseFlags(t *testing.T) {
	env := func(k string) string {
		if k == "REDIS_ADDR" {
			return "127.0.0.1:6379"
		}
		return ""
	}
	o, err := parseFlags([]string{"-listen", "127.0.0.1:18080", "-concurrency", "4"}, env, &strings.Builder{})
	if err != nil {
		t.Fatal(err)
	}
	if o.listen != "127.0.0.1:18080" || o.concurrency != 4 || o.redis != "127.0.0.1:6379" {
		t.Errorf("parsed %+v", o)
	}
	if o.filter != "wasm" {
		t.Errorf("the default filter is %q, want wasm", o.filter)
	}
	for _, args := range [][]string{{"-concurrency", "0"}, {"extra"}, {"-nosuchflag"}, {"-filter", "lua"}} {
		_, err := parseFlags(args, env, &strings.Builder{})
		if _, ok := err.(usageError); !ok {
			t.Errorf("parseFlags(%q) = %v, want a usage error", args, err)
		}
	}
}

// built holds sluice-dev and filter.wasm, built once for the tests that
// run them; TestMain removes it.
var built = struct {
	once      sync.Once
	dir       string
	bin, wasm string
	err       error
}{}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// buildDev builds sluice-dev and filter.wasm (once).
func buildDev(t *testing.T) (bin, wasm string) {
	t.Helper()
	built.once.Do(func() {
		ctx := context.Background()
		if built.dir, built.err = os.MkdirTemp("", "sluice-dev-test"); built.err != nil {
			return
		}
		built.bin, built.wasm = filepath.Join(built.dir, "sluice-dev"), filepath.Join(built.dir, "filter.wasm")
		if built.err = stack.GoBuild(ctx, "./e2e/cmd/sluice-dev", built.bin); built.err == nil {
			built.err = stack.BuildWasm(ctx, built.wasm)
		}
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.bin, built.wasm
}

// devRun is a running sluice-dev, started as `make run` starts it.
type devRun struct {
	cmd    *exec.Cmd
	banner string // stdout up to the banner's last line
	listen string // Envoy's listener
	pids   []int  // Envoy's and the control plane's, from the banner
	stderr *strings.Builder
	exited chan error
}

// startDev runs sluice-dev with args on free ports, env added to the
// test's environment, and waits for its banner.
func startDev(t *testing.T, env []string, args ...string) *devRun {
	t.Helper()
	bin, wasm := buildDev(t)
	var addrs []string
	for range 3 {
		p, err := stack.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, "127.0.0.1:"+strconv.Itoa(p))
	}
	args = append([]string{"-listen", "127.0.0.1:0", "-grpc-addr", addrs[0], "-http-addr", addrs[1], "-policy-addr", addrs[2], "-wasm", wasm}, args...)
	r := &devRun{cmd: exec.Command(bin, args...), stderr: &strings.Builder{}, exited: make(chan error, 1)}
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	r.cmd.Env = append(os.Environ(), env...)
	stdout, err := r.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	r.cmd.Stderr = r.stderr
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		r.exited <- r.cmd.Wait()
	}()
	t.Cleanup(func() { syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL) })

	// The banner: Envoy's address and PID, the control plane's PID.
	envoyLine := regexp.MustCompile(`^\s+envoy\s+(\S+)\s+pid (\d+),`)
	cpLine := regexp.MustCompile(`^\s+control plane\s+\S+\s+decisions \(RLS gRPC\), pid (\d+),`)
	var out strings.Builder
	// It builds the control plane and starts Envoy (up to 5 minutes on a
	// busy machine: see e2e/stack), then prints the banner.
	const bannerWait = 10 * time.Minute
	timeout := time.After(bannerWait)
	curl, end := false, false
	for r.listen == "" || len(r.pids) < 2 || !curl || !end {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("sluice-dev ended before its banner:\n%s\n%s", out.String(), r.stderr.String())
			}
			out.WriteString(l + "\n")
			curl = curl || strings.Contains(l, "for i in $(seq 12); do curl")
			end = end || strings.Contains(l, "(docs/operations.md)") // the banner's last line
			if m := envoyLine.FindStringSubmatch(l); m != nil {
				r.listen = m[1]
				pid, _ := strconv.Atoi(m[2])
				r.pids = append(r.pids, pid)
			}
			if m := cpLine.FindStringSubmatch(l); m != nil {
				pid, _ := strconv.Atoi(m[1])
				r.pids = append(r.pids, pid)
			}
		case <-timeout:
			t.Fatalf("no banner after %v:\n%s\n%s", bannerWait, out.String(), r.stderr.String())
		}
	}
	go func() {
		for range lines {
		}
	}()
	r.banner = out.String()
	return r
}

// expectBanner fails the test unless the banner holds every want.
func (r *devRun) expectBanner(t *testing.T, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(r.banner, w) {
			t.Errorf("the banner lacks %q:\n%s", w, r.banner)
		}
	}
}

// untilLimited sends requests through Envoy until one is refused, and
// returns the status codes and the refused answer (nil: none within 30).
func (r *devRun) untilLimited(t *testing.T) ([]int, *http.Response) {
	t.Helper()
	var codes []int
	for range 30 {
		resp, err := http.Get("http://" + r.listen + "/")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
		if resp.StatusCode == 429 {
			return codes, resp
		}
	}
	return codes, nil
}

// interrupt sends Ctrl-C (SIGINT to the process group, as a terminal
// sends it) and checks that sluice-dev ends with status 0 and every process
// it started (by the PIDs the banner prints) is gone.
func (r *devRun) interrupt(t *testing.T) {
	t.Helper()
	if err := syscall.Kill(-r.cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-r.exited:
		if err != nil {
			t.Fatalf("sluice-dev after SIGINT: %v\n%s", err, r.stderr.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("sluice-dev still runs a minute after SIGINT")
	}
	for _, pid := range r.pids {
		if err := syscall.Kill(pid, 0); err == nil {
			t.Errorf("pid %d still runs after sluice-dev ended", pid)
		}
	}
}

// TestMakeRun runs the sluice-dev binary as `make run` does, on free ports:
// through real Envoy the curl loop of the banner gets 200s, then 429 with
// the RateLimit headers; then Ctrl-C ends sluice-dev with status 0 and
// every process it started is gone.
func TestMakeRun(t *testing.T) {
	if testing.Short() {
		t.Skip("runs Envoy")
	}
	r := startDev(t, []string{"REDIS_ADDR="})
	r.expectBanner(t, "domain sluice-demo (version 1): from the embedded example", "/stats?filter=wasmcustom.sluice",
		"check sluice-demo remote_address=127.0.0.1 --hits 0", "failure_open / failure_closed")

	// The curl loop: 200s until the per-address limit (10 per 10 s), then 429.
	codes, limited := r.untilLimited(t)
	t.Logf("status codes: %v", codes)
	if limited == nil || codes[0] != 200 {
		t.Fatalf("status codes %v: want 200s, then 429", codes)
	}
	for _, h := range []string{"RateLimit-Policy", "RateLimit", "Retry-After"} {
		if len(limited.Header.Values(h)) != 1 {
			t.Errorf("429: %s = %q, want one value", h, limited.Header.Values(h))
		}
	}
	r.interrupt(t)
}

// TestMakeRunNative runs sluice-dev as `make run FILTER=native` does: the
// banner says that Envoy runs the native filter, and through it the curl
// loop gets 200s, then 429.
func TestMakeRunNative(t *testing.T) {
	if testing.Short() {
		t.Skip("runs Envoy")
	}
	r := startDev(t, []string{"REDIS_ADDR="}, "-filter", "native")
	r.expectBanner(t, "envoy/envoy-native.yaml: the NATIVE filter, libsluice.so (an Envoy dynamic module)", "/stats?filter=wasmcustom.sluice")
	codes, limited := r.untilLimited(t)
	t.Logf("status codes: %v", codes)
	if limited == nil || codes[0] != 200 || limited.Header.Get("RateLimit-Policy") == "" {
		t.Fatalf("status codes %v: want 200s, then 429 with RateLimit-Policy", codes)
	}
	r.interrupt(t)
}

// TestMakeRunPolicyTwice: `make run POLICY=my-policy.yaml REDIS_ADDR=...`,
// Ctrl-C, the file edited (5 -> 3 a minute), the same command again: the
// banner says the file is in force and Envoy's RateLimit-Policy says q=3
// (it used to stay q=5, the store's, with the banner saying so).
func TestMakeRunPolicyTwice(t *testing.T) {
	if testing.Short() {
		t.Skip("runs Envoy")
	}
	rs := redistest.StartServer(t)
	file := filepath.Join(t.TempDir(), "my-policy.yaml")
	for _, n := range []int{5, 3} {
		doc := fmt.Sprintf("domain: %s\ndescriptors:\n  - key: remote_address\n    rate_limit: {name: per_address, unit: minute, requests_per_unit: %d}\n", stack.DemoDomain, n)
		if err := os.WriteFile(file, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		r := startDev(t, []string{"REDIS_ADDR=" + rs.Addr()}, "-policy", file)
		r.expectBanner(t, "): from "+file+", in force: the file owns the domain")
		for _, l := range strings.Split(r.banner, "\n") {
			if strings.HasPrefix(strings.TrimSpace(l), "policies") {
				t.Logf("banner: %s", strings.TrimSpace(l))
			}
		}
		// (The second run's counter holds the first run's requests: Redis
		// keeps it, and the window is a minute.)
		codes, limited := r.untilLimited(t)
		if limited == nil || (n == 5 && len(codes) != n+1) {
			t.Fatalf("limit %d: status codes %v, want %d 200s then 429", n, codes, n)
		}
		if got := limited.Header.Get("RateLimit-Policy"); !strings.Contains(got, fmt.Sprintf("q=%d", n)) {
			t.Errorf("limit %d: RateLimit-Policy %q", n, got)
		}
		t.Logf("limit %d: status codes %v, RateLimit-Policy %q", n, codes, limited.Header.Get("RateLimit-Policy"))
		r.interrupt(t)
	}
}
