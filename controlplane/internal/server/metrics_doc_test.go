package server

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/controlplane/policy"
	"github.com/sluicehq/sluice/internal/redistest"
)

// metricsPolicy exercises what registers metrics lazily: a decision, a
// leased limit, a detailed rule.
const metricsPolicy = `
domain: docs
lease: auto
descriptors:
  - key: user
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 100}
`

// controlPlaneMetrics starts a control plane in-process on Redis, with
// RLQS, makes a decision, and returns the names its registry gathers.
func controlPlaneMetrics(t *testing.T) map[string]string {
	t.Helper()
	rds := redistest.StartServer(t)
	set, err := policy.Parse("docs.yaml", []byte(metricsPolicy))
	if err != nil {
		t.Fatal(err)
	}
	pset, err := policy.NewSet(set)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Config{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", PolicyAddr: "127.0.0.1:0", RLQSAddr: "127.0.0.1:0",
		Redis:    RedisConfig{Addrs: []string{rds.Addr()}},
		Policies: pset,
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		<-done
	})
	conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	req := &rlsv3.RateLimitRequest{Domain: "docs", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "alice"}}}}}
	var callErr error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, callErr = client.ShouldRateLimit(cctx, req)
		cancel()
		if callErr == nil {
			break
		}
	}
	if callErr != nil {
		t.Fatal(callErr)
	}
	mfs, err := srv.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "sluice_") {
			out[mf.GetName()] = mf.GetHelp()
		}
	}
	return out
}

// sourceNames returns the string literals matching re (its first group) in
// the non-test Go files under dir.
func sourceNames(t *testing.T, dir string, re *regexp.Regexp) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range re.FindAllSubmatch(b, -1) {
			out[string(m[1])] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestMetricsDocumented: docs/metrics.md has a row for every metric the
// control plane registers (as its registry gathers them, and as its source
// names them: a vector without values yet is not gathered) and every
// counter the filter defines; every row names a metric that exists.
func TestMetricsDocumented(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server")
	}
	b, err := os.ReadFile("../../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `(sluice[._][a-z0-9_.]+)`").FindAllStringSubmatch(string(b), -1) {
		rows[m[1]] = true
	}
	gathered := controlPlaneMetrics(t)
	exist := sourceNames(t, "../..", regexp.MustCompile(`"(sluice_[a-z0-9_]+)"`))
	for name := range gathered {
		exist[name] = true
	}
	filter := sourceNames(t, "../../../filter/core", regexp.MustCompile(`Metric[A-Za-z]+\s*=\s*"(sluice\.[a-z_]+)"`))
	if len(filter) < 10 || len(gathered) < 20 {
		t.Fatalf("found %d filter metrics and gathered %d control-plane metrics: the test no longer sees them", len(filter), len(gathered))
	}
	for name := range filter {
		exist[name] = true
	}
	var missing []string
	for name := range exist {
		if !rows[name] {
			missing = append(missing, name+"  ("+gathered[name]+")")
		}
	}
	sort.Strings(missing)
	for _, m := range missing {
		t.Errorf("metrics.md has no row | `%s` | type | labels | meaning |", m)
	}
	for name := range rows {
		if !exist[name] {
			t.Errorf("metrics.md documents %s, which neither the control plane nor the filter exports", name)
		}
	}
}
