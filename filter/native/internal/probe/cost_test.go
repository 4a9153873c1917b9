package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/e2e/stack"
)

// costVariant is one Envoy of the measurement: no module, or a module with
// a filter configuration.
type costVariant struct {
	name   string
	filter func() stack.M // nil: no module
	mode   string         // the x-probe header of the load (the probe's mode)
}

// TestGoRuntimeCost measures what the Go runtime costs inside Envoy: its
// threads, Envoy's RSS (fixed, and per worker over 1, 2 and 4 workers) and
// its GC's stop-the-world pauses, under a short load, for Envoy alone, the
// empty native module (continuing, or making a callout per request), and
// the probe making 2 KB of garbage per request. A measurement, not a test:
//
//	SLUICE_NATIVE_COST=1 go test -count=1 -v -run TestGoRuntimeCost ./filter/native/internal/probe/
func TestGoRuntimeCost(t *testing.T) {
	if os.Getenv("SLUICE_NATIVE_COST") == "" {
		t.Skip("a measurement: set SLUICE_NATIVE_COST=1")
	}
	// gctrace: each GC cycle's pauses, written by the Go runtime inside
	// Envoy to Envoy's stderr (its log file).
	t.Setenv("GODEBUG", "gctrace=1")
	dir := filepath.Dir(module)
	if _, err := stack.BuildNativeModule(t.Context(), "./filter/native/internal/emptymodule", dir, "sluicefloor"); err != nil {
		t.Fatal(err)
	}
	floor := func(conf string) func() stack.M {
		return func() stack.M { return stack.NativeFilter("sluicefloor", "floor", []byte(conf), "") }
	}
	variants := []costVariant{
		{name: "Envoy alone"},
		{name: "empty module, continue", filter: floor("{}")},
		{name: "empty module, callout", filter: floor(`{"callout":"http"}`)},
		{name: "probe, 2 KB garbage/request", mode: "alloc",
			filter: func() stack.M { return stack.NativeFilter("probe", "probe", []byte(`{"cluster":"echo"}`), "") }},
	}
	fmt.Printf("%-30s %7s %8s %8s %9s %7s %12s %12s %10s\n", "variant", "workers", "threads", "RSS_MB", "requests", "GCs", "pause_p99_us", "pause_max_us", "hook_p99_us")
	rss := map[string][]float64{}
	for _, v := range variants {
		for _, w := range []int{1, 2, 4} {
			r := measureCost(t, dir, v, w)
			rss[v.name] = append(rss[v.name], r.rssMB)
			fmt.Printf("%-30s %7d %8d %8.1f %9d %7d %12.0f %12.0f %10s\n", v.name, w, r.threads, r.rssMB, r.requests, r.gcs,
				r.pauseP99, r.pauseMax, r.hookP99)
		}
	}
	base := rss["Envoy alone"]
	for _, v := range variants[1:] {
		m := rss[v.name]
		perWorker := (m[2] - m[0] - (base[2] - base[0])) / 3
		fmt.Printf("%-30s RSS over Envoy alone: fixed %.1f MB, per worker %.1f MB\n", v.name, m[0]-base[0]-perWorker, perWorker)
	}
}

// costResult is what one Envoy measured.
type costResult struct {
	threads            int
	rssMB              float64
	requests, gcs      int
	pauseP99, pauseMax float64 // microseconds, from gctrace
	hookP99            string  // the probe's, from its runtime report
}

// measureCost runs Envoy with the variant and workers, loads it for 3 s
// from 8 clients, and measures it.
func measureCost(t *testing.T, dir string, v costVariant, workers int) costResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var filters []stack.M
	if v.filter != nil {
		filters = append(filters, v.filter())
	}
	name := fmt.Sprintf("cost-%d-%s", workers, strings.ReplaceAll(strings.Fields(v.name)[0]+v.mode, ",", ""))
	os.Remove(filepath.Join(dir, name+".log"))
	boot := stack.Bootstrap(
		[]stack.M{stack.HTTPListener("in", 0, []stack.M{stack.VirtualHost("all", stack.RouteTo("/", "echo"))}, filters...)},
		[]stack.M{stack.Cluster("echo", upstream.addr()), stack.Cluster("rls", upstream.addr())},
	)
	e, err := stack.StartEnvoy(ctx, stack.EnvoyConfig{Dir: dir, Name: name, Bootstrap: boot, Concurrency: workers, LogLevel: "warning"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Stop()
	n := load(t, e.URL("in"), v.mode, 3*time.Second, 8)
	r := costResult{requests: n, rssMB: float64(e.RSS()) / (1 << 20)}
	if tasks, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(e.PID()), "task")); err == nil {
		r.threads = len(tasks)
	}
	if v.mode == "alloc" {
		r.hookP99 = runtimeSummary(e.URL("in"))
	}
	r.gcs, r.pauseP99, r.pauseMax = stack.GCTracePauses(e.Log())
	return r
}

// runtimeSummary asks the probe for its runtime report and summarizes the
// time its request headers hook took on the workers (p99/max, us) and the
// runtime's own view of its pauses.
func runtimeSummary(url string) string {
	req, _ := http.NewRequest("GET", url+"/", nil)
	req.Header.Set("x-probe", "runtime")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	var rep map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil {
		return err.Error()
	}
	return fmt.Sprint(rep["hook_p99_us"], "/", rep["hook_max_us"], " (STW p99 ", rep["gc_pause_p99_us"], ")")
}

// load sends requests with mode from clients goroutines for d and returns
// how many were answered 200.
func load(t *testing.T, url, mode string, d time.Duration, clients int) int {
	t.Helper()
	var mu sync.Mutex
	ok := 0
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			client := &http.Client{Timeout: 5 * time.Second}
			for i := 0; time.Now().Before(deadline); i++ {
				req, _ := http.NewRequest("GET", url+"/load", nil)
				req.Header.Set("x-user", fmt.Sprintf("u%d-%d", c, i))
				if mode != "" {
					req.Header.Set("x-probe", mode)
					req.Header.Set("x-alloc", "2048")
				}
				resp, err := client.Do(req)
				if err != nil {
					continue
				}
				resp.Body.Close()
				if resp.StatusCode == 200 {
					mu.Lock()
					ok++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	return ok
}
