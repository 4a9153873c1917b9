package rlqs

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/e2e/stack"
	"github.com/sluicehq/sluice/internal/redistest"
)

// limit is the policy's rate, requests per second.
const limit = 100

// policyYAML limits the bucket {name: api} (its entries as a descriptor) to
// limit requests a second.
var policyYAML = fmt.Sprintf(`
domain: rlqs
descriptors:
  - key: name
    value: api
    rate_limit: {unit: second, requests_per_unit: %d}
`, limit)

// fallbackRate is each Envoy's expired_assignment_behavior: a token bucket
// of 2 requests a second, far below any share it is assigned.
const fallbackRate = 2

// quotaFilter is Envoy's rate_limit_quota filter putting every request in
// the bucket {name: api} of domain rlqs, reporting to the cluster rlqs.
// Until the first assignment every request is allowed; once an assignment
// expires, the fallback token bucket applies for a minute.
func quotaFilter() stack.M {
	settings := stack.M{
		"@type":                  "type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings",
		"bucket_id_builder":      stack.M{"bucket_id_builder": stack.M{"name": stack.M{"string_value": "api"}}},
		"reporting_interval":     "5s",
		"no_assignment_behavior": stack.M{"fallback_rate_limit": stack.M{"blanket_rule": "ALLOW_ALL"}},
		"expired_assignment_behavior": stack.M{
			"expired_assignment_behavior_timeout": "60s",
			"fallback_rate_limit": stack.M{"token_bucket": stack.M{
				"max_tokens": 1, "tokens_per_fill": fallbackRate, "fill_interval": "1s"}},
		},
	}
	return stack.M{
		"name": "envoy.filters.http.rate_limit_quota",
		"typed_config": stack.M{
			"@type":       "type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig",
			"rlqs_server": stack.M{"envoy_grpc": stack.M{"cluster_name": "rlqs"}},
			"domain":      "rlqs",
			"bucket_matchers": stack.M{"on_no_match": stack.M{"action": stack.M{
				"name": "rate_limit_quota", "typed_config": settings}}},
		},
	}
}

// envoySpec is one Envoy of the test: its control plane and the rate its
// client sends at.
type envoySpec struct {
	name string
	cp   int     // index of its control plane
	rate float64 // requests per second
}

// budgetBeyond is what the Envoys of a bucket may admit beyond the limit
// over any window (package rlqs): the usage budget, 10 s of the limit.
const budgetBeyond = 10 * limit

// TestQuotaShares runs 3 Envoys with Envoy's rate_limit_quota filter
// against 2 control-plane replicas sharing Redis, with demand in the ratio
// 1:4:10 and a total of 3x the limit, replaces one Envoy by a new one (a
// rolling restart), then kills the control planes.
//
//   - Before the second periodic report, newcomers borrow their fair share
//     from the usage budget: the admitted rate stays within the limit
//     plus the budget (10 s of the limit) over the first 10 s. From the
//     second report on it is within 5% of the limit in every 5 s interval,
//     and the Envoy whose demand is below its fair share gets all of it.
//   - The Envoy that replaces another is never denied everything: from its
//     second report on, the admitted rate is within [95%, 100% + the share
//     the departed Envoy held], and the newcomer gets a share. (Before, it
//     got DENY_ALL until the departed Envoy's assignment expired.)
//   - With the control planes gone, each Envoy stays on its last assignment
//     until the time-to-live (15 s), then on its configured fallback.
func TestQuotaShares(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Envoys, control planes and Redis")
	}
	ctx := context.Background()
	dir := t.TempDir()
	pol := filepath.Join(dir, "rlqs.yaml")
	if err := os.WriteFile(pol, []byte(policyYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	rdb := redistest.StartServer(t)
	var cps []*stack.ControlPlane
	var rlqsAddrs []string
	for range 2 {
		port, err := stack.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		addr := "127.0.0.1:" + strconv.Itoa(port)
		cp, err := stack.StartControlPlane(ctx, stack.ControlPlaneConfig{Binary: controlPlane, Dir: dir, Policies: []string{pol},
			RedisAddr: rdb.Addr(), Args: []string{"-rlqs-addr", addr, "-deadline", "500ms", "-log-level", "debug"}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cp.Kill()
			if t.Failed() {
				b, _ := os.ReadFile(cp.LogPath())
				t.Logf("control plane log (%s):\n%s", cp.LogPath(), lastLines(string(b), 40))
			}
		})
		cps = append(cps, cp)
		rlqsAddrs = append(rlqsAddrs, addr)
	}
	up, err := startUpstream()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(up.close)

	// start runs an Envoy of spec and its client until the returned stop.
	lctx, stopAll := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stopAll(); wg.Wait() }()
	start := func(s envoySpec) (*load, func()) {
		boot := stack.Bootstrap(
			[]stack.M{stack.HTTPListener("in", 0, []stack.M{stack.VirtualHost("all", stack.RouteTo("/", "up"))}, quotaFilter())},
			[]stack.M{stack.Cluster("up", up.ln.Addr().String()), stack.GRPCCluster("rlqs", rlqsAddrs[s.cp])})
		e, err := stack.StartEnvoy(ctx, stack.EnvoyConfig{Name: s.name, Dir: dir, Bootstrap: boot, Concurrency: 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("%s log:\n%s", s.name, lastLines(e.Log(), 15))
			}
			e.Stop()
		})
		l := &load{}
		cctx, cancel := context.WithCancel(lctx)
		done := make(chan struct{})
		wg.Add(1)
		go func() { defer wg.Done(); defer close(done); l.run(cctx, e.URL("in")+"/", s.name, s.rate) }()
		return l, func() { cancel(); <-done; e.Stop() }
	}
	specs := []envoySpec{{"e1", 0, 0.2 * limit}, {"e2", 0, 0.8 * limit}, {"e3", 1, 2.0 * limit}}
	loads := make([]*load, len(specs))
	stops := make([]func(), len(specs))
	t0 := time.Now()
	for i, s := range specs {
		loads[i], stops[i] = start(s)
	}
	// rate returns what the Envoys named admitted in [from, to), a second.
	rate := func(from, to time.Time, names ...string) (float64, string) {
		total := 0
		var per []string
		for _, n := range names {
			k := up.count(n, from, to)
			total += k
			per = append(per, fmt.Sprintf("%s %.1f/s", n, float64(k)/to.Sub(from).Seconds()))
		}
		return float64(total) / to.Sub(from).Seconds(), strings.Join(per, ", ")
	}

	// Each Envoy reports on creating the bucket (t0) and then every 5 s.
	// From 10 s on, every Envoy has sent two periodic reports and been
	// answered: measure four 5 s intervals.
	const measureFrom, intervals = 10 * time.Second, 4
	sleepUntil(t0.Add(measureFrom + intervals*5*time.Second))
	t.Logf("admitted per 5 s interval (limit %d/s; demand %v/s):", limit, []float64{specs[0].rate, specs[1].rate, specs[2].rate})
	if r, per := rate(t0, t0.Add(measureFrom), "e1", "e2", "e3"); r*measureFrom.Seconds() > limit*measureFrom.Seconds()+budgetBeyond {
		t.Errorf("[0s, 10s): admitted %.1f/s (%s), more than the limit and the usage budget", r, per)
	}
	for k := -2; k < intervals; k++ {
		from := t0.Add(measureFrom + time.Duration(k)*5*time.Second)
		to := from.Add(5 * time.Second)
		r, per := rate(from, to, "e1", "e2", "e3")
		t.Logf("  [%2.0fs, %2.0fs): %.1f/s = %.1f%% of the limit (%s)", from.Sub(t0).Seconds(), to.Sub(t0).Seconds(), r, 100*r/limit, per)
		if k < 0 { // newcomers borrow until their second report
			continue
		}
		if math.Abs(r-limit) > 0.05*limit {
			t.Errorf("[%v, %v): admitted %.1f/s, want within 5%% of %d/s", from.Sub(t0), to.Sub(t0), r, limit)
		}
		// e1's demand is below its fair share: it must get all of it, both
		// in requests admitted and in requests refused (which do not depend
		// on how fast the client could send on a busy machine).
		admitted, refused := up.count("e1", from, to), loads[0].limitedIn(from, to)
		if float64(admitted) < 0.95*5*specs[0].rate || refused > admitted/20 {
			t.Errorf("[%v, %v): e1 got %d requests admitted and %d refused at %.0f/s, below its fair share: want all of it (95%%+)",
				from.Sub(t0), to.Sub(t0), admitted, refused, specs[0].rate)
		}
	}

	// A rolling restart: e2 stops (its stream closes with it) and a new
	// Envoy, e2b, takes its load. From e2b's second periodic report on
	// (10 s after its first request), measure two 5 s intervals.
	stops[1]()
	specs[1] = envoySpec{"e2b", 0, 0.8 * limit}
	t1 := time.Now()
	loads[1], stops[1] = start(specs[1])
	sleepUntil(t1.Add(measureFrom + 10*time.Second))
	departed := (limit - 0.2*limit) / 2 // e2's share: half of what e1 leaves
	t.Logf("e2 replaced by e2b; admitted per 5 s interval after e2b started:")
	for k := range 4 {
		from := t1.Add(time.Duration(k) * 5 * time.Second)
		to := from.Add(5 * time.Second)
		r, per := rate(from, to, "e1", "e2b", "e3")
		t.Logf("  [%2.0fs, %2.0fs): %.1f/s = %.1f%% of the limit (%s)", from.Sub(t1).Seconds(), to.Sub(t1).Seconds(), r, 100*r/limit, per)
		if k < 2 { // before e2b's second report
			continue
		}
		if r < 0.95*limit || r > limit+departed {
			t.Errorf("[%v, %v) after e2b started: admitted %.1f/s, want within [95%%, 100%% + %.0f/s]", from.Sub(t1), to.Sub(t1), r, departed)
		}
		if n := up.count("e2b", from, to); n == 0 {
			t.Errorf("[%v, %v) after e2b started: e2b admitted nothing", from.Sub(t1), to.Sub(t1))
		}
	}

	// Kill every control plane: the Envoys keep their last assignment,
	// received within the last 5 s, for its 15 s time-to-live, then apply
	// their fallback.
	kill := time.Now()
	last := make([]float64, len(specs))
	for i, s := range specs {
		last[i] = float64(up.count(s.name, kill.Add(-5*time.Second), kill)) / 5
	}
	for _, cp := range cps {
		cp.Kill()
	}
	sleepUntil(kill.Add(10 * time.Second))
	t.Logf("control planes killed; admitted in [1s, 10s) after (last assignment, TTL 15 s):")
	for i, s := range specs {
		got := float64(up.count(s.name, kill.Add(time.Second), kill.Add(10*time.Second))) / 9
		t.Logf("  %s: %.1f/s (before the kill %.1f/s)", s.name, got, last[i])
		if math.Abs(got-last[i]) > 0.1*last[i]+1 {
			t.Errorf("%s admitted %.1f/s after the kill, want its last assignment's %.1f/s (within 10%%)", s.name, got, last[i])
		}
	}
	sleepUntil(kill.Add(24 * time.Second))
	t.Logf("admitted in [16s, 24s) after the kill (assignments expired, fallback %d/s):", fallbackRate)
	for _, s := range specs {
		n := up.count(s.name, kill.Add(16*time.Second), kill.Add(24*time.Second))
		t.Logf("  %s: %.2f/s", s.name, float64(n)/8)
		if n > fallbackRate*8+2 || n < fallbackRate*8/2 {
			t.Errorf("%s admitted %d requests in 8 s once its assignment expired, want the fallback's %d/s", s.name, n, fallbackRate)
		}
	}
	for i, s := range specs {
		t.Logf("%s client: sent %d, 200 %d, 429 %d, failed %d, skipped %d", s.name, loads[i].sent.Load(), loads[i].ok.Load(),
			loads[i].limited.Load(), loads[i].failed.Load(), loads[i].skipped.Load())
	}
}

// sleepUntil waits until t (waiting on real processes).
func sleepUntil(t time.Time) { time.Sleep(time.Until(t)) }

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
