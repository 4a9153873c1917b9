package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/controlplane/internal/server"
	"github.com/sluicehq/sluice/controlplane/policy"
)

func TestBuckets(t *testing.T) {
	// Every value falls inside its bucket's bounds, buckets are contiguous
	// and each spans at most 1/32 of its values.
	prevHi := uint64(0)
	for i := 0; i < buckets-1; i++ {
		lo, hi := bounds(i)
		if lo != prevHi && i > 0 {
			t.Fatalf("bucket %d starts at %d, previous ended at %d", i, lo, prevHi)
		}
		prevHi = hi
		if lo >= 1<<subBits && float64(hi-lo)/float64(lo) > 1.0/32 {
			t.Fatalf("bucket %d [%d,%d) too wide", i, lo, hi)
		}
		for _, v := range []uint64{lo, hi - 1} {
			if b := bucketOf(v); b != i {
				t.Fatalf("value %d in bucket %d, want %d", v, b, i)
			}
		}
		if hi > math.MaxInt64/2 {
			break
		}
	}
}

func TestQuantiles(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var h histogram
	var vals []time.Duration
	for i := 0; i < 20000; i++ {
		d := time.Duration(rng.ExpFloat64() * float64(time.Millisecond))
		vals = append(vals, d)
		h.record(d)
	}
	slices.Sort(vals)
	for _, q := range []float64{0.5, 0.95, 0.99, 1} {
		exact := vals[int(math.Ceil(q*float64(len(vals))))-1]
		got := h.quantile(q)
		if math.Abs(float64(got-exact)) > 0.04*float64(exact) {
			t.Errorf("q%.2f: %v, exact %v", q, got, exact)
		}
	}
	var empty histogram
	if empty.quantile(0.5) != 0 {
		t.Error("empty histogram quantile not 0")
	}
	var merged histogram
	merged.merge(&h)
	merged.merge(&empty)
	if merged.n != h.n || merged.max != h.max || merged.quantile(0.99) != h.quantile(0.99) {
		t.Error("merge changed the distribution")
	}
}

func TestFlags(t *testing.T) {
	bad := map[string][]string{
		"not a loopback address": {"-addr", "192.0.2.1:8081"},
		"-callers must be":       {"-callers", "0"},
		"-duration must be":      {"-duration", "11m"},
		"-keys must be":          {"-keys", "0"},
		"unexpected arguments":   {"x"},
		"-domain must not":       {"-domain", ""},
		"-client must be":        {"-client", "curl"},
	}
	for want, args := range bad {
		var stderr bytes.Buffer
		if code := run(context.Background(), args, io.Discard, &stderr); code != 2 || !strings.Contains(stderr.String(), want) {
			t.Errorf("%v: exit %d, %q; want 2 and %q", args, code, stderr.String(), want)
		}
	}
	if _, err := parseFlags([]string{"-addr", "localhost:1"}, io.Discard); err != nil {
		t.Errorf("localhost refused: %v", err)
	}
}

// TestLoad runs the tool against an in-process control plane: it must see
// both answers and no errors, and the counts must add up.
func TestLoad(t *testing.T) {
	d, err := policy.Parse("bench.yaml", []byte(`
domain: bench
descriptors:
  - key: k0
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: k1
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 5}
`))
	if err != nil {
		t.Fatal(err)
	}
	set, _ := policy.NewSet(d)
	srv, err := server.New(server.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Policies: set,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()

	for i, client := range []string{clientLean, clientGRPC} {
		var out, stderr bytes.Buffer
		code := run(context.Background(), []string{"-addr", srv.GRPCAddr(), "-callers", "8", "-keys", "10", "-client", client,
			"-domain", "bench", "-key", "k" + strconv.Itoa(i), "-duration", "5s", "-requests", "400", "-json"}, &out, &stderr)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s%s", client, code, out.String(), stderr.String())
		}
		var s Summary
		if err := json.Unmarshal(out.Bytes(), &s); err != nil {
			t.Fatalf("%s: %v: %s", client, err, out.String())
		}
		// 400 calls over 10 keys limited to 5 a minute: 50 OK, 350 over.
		if s.Decisions != 400 || s.OK != 50 || s.OverLimit != 350 || s.Errors != 0 {
			t.Fatalf("%s: summary %+v", client, s)
		}
		if s.PerSecond <= 0 || s.P50Ms <= 0 || s.P50Ms > s.P99Ms || s.P99Ms > s.MaxMs {
			t.Fatalf("%s: rates or latencies %+v", client, s)
		}
	}
	var out, stderr bytes.Buffer
	out.Reset()
	if code := run(context.Background(), []string{"-addr", srv.GRPCAddr(), "-callers", "2", "-domain", "bench", "-key", "k", "-requests", "20"}, &out, &stderr); code != 0 ||
		!strings.Contains(out.String(), "decisions: 20 in") || !strings.Contains(out.String(), "latency: p50") {
		t.Fatalf("text output (exit %d):\n%s", code, out.String())
	}
}

// fakeRLS answers by domain: "fail" with an error status, "slow" after
// 300 ms, anything else OK.
type fakeRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (fakeRLS) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	switch req.Domain {
	case "fail":
		return nil, status.Error(codes.ResourceExhausted, "no capacity")
	case "slow":
		select {
		case <-time.After(300 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
}

// TestClientErrors: both clients count error statuses and timeouts as
// errors and report the first.
func TestClientErrors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(gs, fakeRLS{})
	go gs.Serve(ln)
	defer gs.Stop()
	for _, client := range []string{clientLean, clientGRPC} {
		for _, c := range []struct {
			domain, timeout, want string
		}{
			{"fail", "1s", "no capacity"},
			{"slow", "50ms", "deadline"},
		} {
			var out, stderr bytes.Buffer
			code := run(context.Background(), []string{"-addr", ln.Addr().String(), "-callers", "4", "-client", client,
				"-domain", c.domain, "-timeout", c.timeout, "-duration", "5s", "-requests", "8", "-json"}, &out, &stderr)
			var s Summary
			if err := json.Unmarshal(out.Bytes(), &s); err != nil {
				t.Fatalf("%s %s: exit %d, %v: %s%s", client, c.domain, code, err, out.String(), stderr.String())
			}
			if code != 1 || s.Errors != 8 || s.Decisions != 0 || !strings.Contains(strings.ToLower(s.FirstError), c.want) {
				t.Errorf("%s %s: exit %d, summary %+v", client, c.domain, code, s)
			}
		}
		var out, stderr bytes.Buffer
		if code := run(context.Background(), []string{"-addr", ln.Addr().String(), "-client", client, "-domain", "ok",
			"-requests", "50", "-json"}, &out, &stderr); code != 0 || !strings.Contains(out.String(), `"ok":50`) {
			t.Errorf("%s: exit %d: %s%s", client, code, out.String(), stderr.String())
		}
	}
}
