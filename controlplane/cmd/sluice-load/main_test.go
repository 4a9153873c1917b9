package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/controlplane/policy"
	"github.com/sluicehq/sluice/controlplane/server"
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

	var out, stderr bytes.Buffer
	code := run(context.Background(), []string{"-addr", srv.GRPCAddr(), "-callers", "8", "-keys", "10",
		"-domain", "bench", "-key", "k", "-duration", "5s", "-requests", "400", "-json"}, &out, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s%s", code, out.String(), stderr.String())
	}
	var s Summary
	if err := json.Unmarshal(out.Bytes(), &s); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	// 400 calls over 10 keys limited to 5 a minute: 50 OK, 350 over.
	if s.Decisions != 400 || s.OK != 50 || s.OverLimit != 350 || s.Errors != 0 {
		t.Fatalf("summary %+v", s)
	}
	if s.PerSecond <= 0 || s.P50Ms <= 0 || s.P50Ms > s.P99Ms || s.P99Ms > s.MaxMs {
		t.Fatalf("rates or latencies %+v", s)
	}
	out.Reset()
	if code := run(context.Background(), []string{"-addr", srv.GRPCAddr(), "-callers", "2", "-domain", "bench", "-key", "k", "-requests", "20"}, &out, &stderr); code != 0 ||
		!strings.Contains(out.String(), "decisions: 20 in") || !strings.Contains(out.String(), "latency: p50") {
		t.Fatalf("text output (exit %d):\n%s", code, out.String())
	}
}
