package dashboards

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/e2e/stack"
)

// dashboard is what the test reads of Grafana's dashboard JSON.
type dashboard struct {
	Title  string `json:"title"`
	Panels []struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

// metricName finds the metric names in a PromQL expression: sluice's own
// and the Envoy filter's all start with "sluice_".
var metricName = regexp.MustCompile(`\bsluice_[a-zA-Z0-9_]+`)

// queried returns every metric name the dashboard's queries use, with the
// panel titles that use it.
func queried(t *testing.T) map[string][]string {
	t.Helper()
	b, err := os.ReadFile("grafana-sluice.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("grafana-sluice.json: %v", err)
	}
	if d.Title == "" || len(d.Panels) == 0 {
		t.Fatal("grafana-sluice.json: no title or no panels")
	}
	names := map[string][]string{}
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			found := metricName.FindAllString(q.Expr, -1)
			if len(found) == 0 {
				t.Errorf("panel %q: query %q names no sluice metric", p.Title, q.Expr)
			}
			for _, n := range found {
				names[n] = append(names[n], p.Title)
			}
		}
	}
	return names
}

// TestDashboardQueriesExportedMetrics starts a control plane on Redis and
// Envoy with filter.wasm in front of an upstream, sends requests until one
// is refused, and checks that every metric the dashboard queries is among
// those the two export (/metrics, and Envoy's /stats/prometheus).
func TestDashboardQueriesExportedMetrics(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Redis, the control plane and Envoy")
	}
	want := queried(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := t.TempDir()
	cp := filepath.Join(dir, "sluice-controlplane")
	if err := stack.GoBuild(ctx, "./controlplane/cmd/sluice-controlplane", cp); err != nil {
		t.Fatal(err)
	}
	wasm := filepath.Join(dir, "filter.wasm")
	if err := stack.BuildWasm(ctx, wasm); err != nil {
		t.Fatal(err)
	}
	redis, err := stack.StartRedis(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer redis.Stop()
	pol := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(pol, []byte("domain: dash\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 2}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := stack.StartControlPlane(ctx, stack.ControlPlaneConfig{Binary: cp, Dir: dir, RedisAddr: redis.Addr(), Policies: []string{pol}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	up, err := stack.StartUpstream("127.0.0.1:0", "")
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close(ctx)
	plugin := []byte(`{"cluster":"rls","domain":"dash","timeout":"500ms","failure_mode":"open",` +
		`"rate_limits":[{"actions":[{"request_headers":{"header_name":"x-user","descriptor_key":"user"}}]}],"precheck":{"enabled":true}}`)
	e, err := stack.StartEnvoy(ctx, stack.EnvoyConfig{Dir: dir, Bootstrap: stack.Bootstrap(
		[]stack.M{stack.HTTPListener("in", 0, []stack.M{stack.VirtualHost("in", stack.RouteTo("/", "up"))},
			stack.WasmFilter(wasm, plugin))},
		[]stack.M{stack.Cluster("up", up.Addr()), stack.GRPCCluster("rls", c.GRPCAddr())})})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Stop()
	codes := map[int]int{}
	for range 5 {
		req, _ := http.NewRequestWithContext(ctx, "GET", e.URL("in")+"/", nil)
		req.Header.Set("x-user", "alice")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		codes[resp.StatusCode]++
	}
	if codes[200] != 2 || codes[429] != 3 {
		t.Fatalf("answers %v, want two 200s and three 429s", codes)
	}

	have := map[string]bool{}
	for _, url := range []string{c.HTTPURL() + "/metrics", e.AdminURL() + "/stats/prometheus"} {
		if err := exported(ctx, url, have); err != nil {
			t.Fatal(err)
		}
	}
	var missing []string
	for n, panels := range want {
		if !have[n] {
			missing = append(missing, fmt.Sprintf("%s (panels %q)", n, slices.Compact(panels)))
		}
	}
	slices.Sort(missing)
	if len(missing) > 0 {
		t.Fatalf("the dashboard queries metrics nothing exports:\n  %s", strings.Join(missing, "\n  "))
	}
	t.Logf("%d metrics queried, all exported", len(want))
}

// exported adds to have the metric names a Prometheus text endpoint
// declares (# TYPE lines), with the series names of histograms and
// summaries (_bucket, _sum, _count).
func exported(ctx context.Context, url string, have map[string]bool) error {
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 4 || f[0] != "#" || f[1] != "TYPE" {
			continue
		}
		have[f[2]] = true
		if f[3] == "histogram" || f[3] == "summary" {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				have[f[2]+s] = true
			}
		}
	}
	return sc.Err()
}

// TestMetricName checks the query parser of this test on
// a query with a histogram and a filter counter.
func TestMetricName(t *testing.T) {
	got := metricName.FindAllString(`histogram_quantile(0.99, sum by (le) (rate(sluice_store_redis_duration_seconds_bucket[$__rate_interval]))) / sum(rate(sluice_precheck_rejected[1m]))`, -1)
	if !slices.Equal(got, []string{"sluice_store_redis_duration_seconds_bucket", "sluice_precheck_rejected"}) {
		t.Fatalf("metric names %q", got)
	}
}
