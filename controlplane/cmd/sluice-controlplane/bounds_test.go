package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"google.golang.org/grpc"
	grpccodes "google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/controlplane/api/sluice/v1"
)

// TestBinaryLogFlood: 2,000 calls with a wrong token write a handful of
// refusal lines, not 2,000 (before logthrottle: one WARN line per call).
func TestBinaryLogFlood(t *testing.T) {
	const token = "test-token-0123456789abcdef"
	p, rec := startBinary(t, []string{"SLUICE_TOKEN=" + token}, "-policy", writePolicy(t, binPolicy))
	conn, err := grpc.NewClient(rec["policy"].(string), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	pc := sluicev1.NewPolicyServiceClient(conn)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer wrong-token-0123456789abcdef")
	const calls = 2000
	for range calls {
		if _, err := pc.List(ctx, &sluicev1.ListRequest{}); status.Code(err) != grpccodes.Unauthenticated {
			t.Fatalf("List with a wrong token: %v", err)
		}
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit %d:\n%s", code, p.output())
	}
	out := p.output()
	refused := strings.Count(out, `"msg":"policy service: refused a call"`)
	t.Logf("%d wrong-token calls: %d refusal lines, %d bytes of log", calls, refused, len(out))
	if refused > 20 {
		t.Errorf("%d refusal lines for %d calls, want at most 20", refused, calls)
	}
	if !strings.Contains(out, `"msg":"log lines suppressed: too many alike","message":"policy service: refused a call"`) {
		t.Errorf("no summary of the suppressed lines:\n%s", out)
	}
}

// procStatus returns the kB values of /proc/<pid>/status's fields.
func procStatus(t *testing.T, pid int) map[string]int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, line := range strings.Split(string(b), "\n") {
		name, rest, ok := strings.Cut(line, ":")
		f := strings.Fields(rest)
		if !ok || len(f) != 2 || f[1] != "kB" {
			continue
		}
		if v, err := strconv.ParseInt(f[0], 10, 64); err == nil {
			out[name] = v << 10
		}
	}
	return out
}

// procCPU returns the CPU time (user and system) a process has used.
func procCPU(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// The fields after the command name (in parentheses): utime and stime
	// are the 12th and 13th, in clock ticks (100 a second on Linux).
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+s) * 10 * time.Millisecond
}

// metric returns a gauge's value from /metrics.
func metric(t *testing.T, httpAddr, name string) float64 {
	t.Helper()
	_, body := httpGet(t, "http://"+httpAddr+"/metrics")
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	t.Fatalf("no %s in /metrics", name)
	return 0
}

// TestBinaryMemoryBound fills the memory store of the real binary with far
// more distinct keys than its -memory-max-bytes holds, through
// ShouldRateLimit calls of 256 descriptors, and checks the peak RSS
// (VmHWM) against 1.5 x -memory-max-bytes + RSSOverhead. Before the
// Go memory limit, -gc-percent 400 let the heap grow to 5x the live store
// (1.37 GB for a 256 MB bound). SLUICE_TEST_MEMORY_MIB and
// SLUICE_TEST_MEMORY_KEYS run the full size (256 and 2000000).
func TestBinaryMemoryBound(t *testing.T) {
	bound := int64(envInt(t, "SLUICE_TEST_MEMORY_MIB", 32)) << 20
	keys := envInt(t, "SLUICE_TEST_MEMORY_KEYS", 500_000)
	p, rec := startBinary(t, nil, "-policy", writePolicy(t, binPolicy), "-memory-max-bytes", strconv.FormatInt(bound, 10),
		"-memory-max-entries", "100000000")
	grpcAddr, httpAddr := rec["grpc"].(string), rec["http"].(string)
	pid := p.cmd.Process.Pid
	base := procStatus(t, pid)["VmRSS"]

	const perCall, workers = 256, 4
	start := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				errc <- err
				return
			}
			defer conn.Close()
			c := rlsv3.NewRateLimitServiceClient(conn)
			req := &rlsv3.RateLimitRequest{Domain: "bin"}
			for {
				first := next.Add(perCall) - perCall
				if first >= int64(keys) {
					return
				}
				req.Descriptors = req.Descriptors[:0]
				for i := first; i < first+perCall; i++ {
					req.Descriptors = append(req.Descriptors, &ratelimitv3.RateLimitDescriptor{
						Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: fmt.Sprintf("user-%09d", i)}}})
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err := c.ShouldRateLimit(ctx, req)
				cancel()
				if err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	elapsed := time.Since(start)
	cpu := procCPU(t, pid)
	st := procStatus(t, pid)
	entries, bytes := metric(t, httpAddr, "sluice_memory_entries"), metric(t, httpAddr, "sluice_memory_bytes")
	budget := bound + bound/2 + RSSOverhead
	t.Logf("%d keys in %v (server CPU %v): entries %.0f, sluice_memory_bytes %.0f MiB (bound %d MiB); RSS %d MiB at start, %d MiB now, peak %d MiB (budget %d MiB)",
		keys, elapsed.Round(time.Millisecond), cpu, entries, bytes/(1<<20), bound>>20, base>>20, st["VmRSS"]>>20, st["VmHWM"]>>20, budget>>20)
	if bytes > float64(bound) {
		t.Errorf("sluice_memory_bytes %.0f over the bound %d", bytes, bound)
	}
	if st["VmHWM"] > budget {
		t.Errorf("peak RSS %d MiB over 1.5 x %d MiB + %d MiB = %d MiB", st["VmHWM"]>>20, bound>>20, RSSOverhead>>20, budget>>20)
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit %d:\n%s", code, p.output())
	}
}

// envInt returns the environment variable name as an int, or def.
func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("$%s: %v", name, err)
	}
	return n
}

// TestMemoryLimit: the Go memory limit derived from -memory-max-bytes.
func TestMemoryLimit(t *testing.T) {
	tests := []struct{ store, want int64 }{
		{256 << 20, 408 << 20}, // the default bound
		{32 << 20, 72 << 20},
		{1 << 62, math.MaxInt64 / 2}, // no overflow
	}
	for _, tc := range tests {
		if got := memoryLimit(tc.store); got != tc.want {
			t.Errorf("memoryLimit(%d) = %d, want %d", tc.store, got, tc.want)
		}
	}
}

// TestBinaryGOMEMLIMITWins: an explicit $GOMEMLIMIT is left alone.
func TestBinaryGOMEMLIMITWins(t *testing.T) {
	for _, env := range []string{"", "1GiB"} {
		p, _ := startBinary(t, []string{"GOMEMLIMIT=" + env}, "-policy", writePolicy(t, binPolicy))
		if code := p.stop(t); code != 0 {
			t.Fatalf("exit %d", code)
		}
		set := strings.Contains(p.output(), `"msg":"Go memory limit set from the bounds","gomemlimit_bytes":427819008`)
		if set != (env == "") {
			t.Errorf("GOMEMLIMIT=%q: limit set from the bounds: %v\n%s", env, set, p.output())
		}
	}
}
