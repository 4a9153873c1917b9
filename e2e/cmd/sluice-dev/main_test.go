package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/controlplane/policy"
	"github.com/sluicehq/sluice/e2e/stack"
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
	for _, args := range [][]string{{"-concurrency", "0"}, {"extra"}, {"-nosuchflag"}} {
		_, err := parseFlags(args, env, &strings.Builder{})
		if _, ok := err.(usageError); !ok {
			t.Errorf("parseFlags(%q) = %v, want a usage error", args, err)
		}
	}
}

// TestMakeRun runs the sluice-dev binary as `make run` does, on free ports:
// through real Envoy the curl loop of the banner gets 200s, then 429 with
// the RateLimit headers; then Ctrl-C (SIGINT to the process group, as a
// terminal sends it) ends sluice-dev with status 0 and every process it
// started (Envoy and the control plane, by the PIDs the banner prints) is
// gone.
func TestMakeRun(t *testing.T) {
	if testing.Short() {
		t.Skip("runs Envoy")
	}
	ctx := context.Background()
	dir := t.TempDir()
	bin := filepath.Join(dir, "sluice-dev")
	if err := stack.GoBuild(ctx, "./e2e/cmd/sluice-dev", bin); err != nil {
		t.Fatal(err)
	}
	wasm := filepath.Join(dir, "filter.wasm")
	if err := stack.BuildWasm(ctx, wasm); err != nil {
		t.Fatal(err)
	}
	var addrs []string
	for range 3 {
		p, err := stack.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, "127.0.0.1:"+strconv.Itoa(p))
	}
	cmd := exec.Command(bin, "-listen", "127.0.0.1:0", "-grpc-addr", addrs[0], "-http-addr", addrs[1], "-policy-addr", addrs[2], "-wasm", wasm)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Env = append(os.Environ(), "REDIS_ADDR=")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		exited <- cmd.Wait()
	}()
	defer func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}()

	// The banner: Envoy's address and PID, the control plane's PID.
	envoyLine := regexp.MustCompile(`^\s+envoy\s+(\S+)\s+pid (\d+),`)
	cpLine := regexp.MustCompile(`^\s+control plane\s+\S+\s+decisions \(RLS gRPC\), pid (\d+),`)
	var listen string
	var pids []int
	var out strings.Builder
	// It builds the control plane and starts Envoy (up to 5 minutes on a
	// busy machine: see e2e/stack), then prints the banner.
	const bannerWait = 10 * time.Minute
	timeout := time.After(bannerWait)
	curl, end := false, false
	for listen == "" || len(pids) < 2 || !curl || !end {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("sluice-dev ended before its banner:\n%s\n%s", out.String(), stderr.String())
			}
			out.WriteString(l + "\n")
			curl = curl || strings.Contains(l, "for i in $(seq 12); do curl")
			end = end || strings.Contains(l, "(docs/operations.md)") // the banner's last line
			if m := envoyLine.FindStringSubmatch(l); m != nil {
				listen = m[1]
				pid, _ := strconv.Atoi(m[2])
				pids = append(pids, pid)
			}
			if m := cpLine.FindStringSubmatch(l); m != nil {
				pid, _ := strconv.Atoi(m[1])
				pids = append(pids, pid)
			}
		case <-timeout:
			t.Fatalf("no banner after %v:\n%s\n%s", bannerWait, out.String(), stderr.String())
		}
	}
	go func() {
		for range lines {
		}
	}()
	for _, w := range []string{"domain sluice-demo (version 1): from the embedded example", "/stats?filter=wasmcustom.sluice",
		"check sluice-demo remote_address=127.0.0.1 --hits 0", "failure_open / failure_closed"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("the banner lacks %q:\n%s", w, out.String())
		}
	}

	// The curl loop: 200s until the per-address limit (10 per 10 s), then 429.
	var codes []int
	var limited *http.Response
	for range 30 {
		resp, err := http.Get("http://" + listen + "/")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
		if resp.StatusCode == 429 {
			limited = resp
			break
		}
	}
	t.Logf("status codes: %v", codes)
	if limited == nil || codes[0] != 200 {
		t.Fatalf("status codes %v: want 200s, then 429", codes)
	}
	for _, h := range []string{"RateLimit-Policy", "RateLimit", "Retry-After"} {
		if len(limited.Header.Values(h)) != 1 {
			t.Errorf("429: %s = %q, want one value", h, limited.Header.Values(h))
		}
	}

	// Ctrl-C.
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("sluice-dev after SIGINT: %v\n%s", err, stderr.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("sluice-dev still runs a minute after SIGINT")
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); err == nil {
			t.Errorf("pid %d still runs after sluice-dev ended", pid)
		}
	}
}
