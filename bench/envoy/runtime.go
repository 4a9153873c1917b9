package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/e2e/stack"
)

// runtimeCost is bench-envoy -runtime: what the Go runtime costs inside
// Envoy with the native filter deciding setup 7's load (the spread load,
// sluice-controlplane on Redis), at each worker count of -runtime against
// Envoy alone (setup 1) under the same load: Envoy's threads, its RSS (what
// the module adds at one worker, and per worker), the GC's stop-the-world
// pauses (the runtime's own histogram, and each cycle's from gctrace), and
// the time the request headers hook took on the workers, which a pause, or
// a worker's share of the collector's work, lengthens. It runs the
// sluicetest build of libsluice.so, which times that hook and answers a
// request for the report (filter/native's testhooks_sluicetest.go).
func (b *built) runtimeCost(ctx context.Context, dir string, cfg config) error {
	counts, err := parseWorkers(cfg.runtime)
	if err != nil || len(counts) == 0 {
		return fmt.Errorf("-runtime %q: worker counts such as 1,2,4", cfg.runtime)
	}
	rt := filepath.Join(dir, "runtime")
	if err := os.MkdirAll(rt, 0o755); err != nil {
		return err
	}
	if err := stack.BuildNativeTest(ctx, filepath.Join(rt, "libsluice.so")); err != nil {
		return err
	}
	fmt.Printf("the Go runtime inside Envoy %s: the native filter (sluicetest build) under setup 7's spread load, wrk -c%d for %v after %v warm-up, against Envoy alone (setup 1)\n",
		b.envoyVersion, cfg.connections, cfg.duration, cfg.warmup)
	fmt.Printf("%-7s %-7s %8s %8s %9s %5s %11s %11s %11s %11s %11s %11s %11s\n", "workers", "filter", "threads", "RSS_MB", "req/s", "GCs",
		"stw_p99_us", "stw_max_us", "trace_p99", "trace_max", "hook_p50_us", "hook_p99_us", "hook_max_us")
	var alone, native []runtimeRun
	for _, w := range counts {
		for _, withFilter := range []bool{false, true} {
			r, err := b.runtimeRun(ctx, rt, cfg, w, withFilter)
			if err != nil {
				return fmt.Errorf("-runtime, %d workers: %w", w, err)
			}
			fmt.Println(r.row())
			if withFilter {
				native = append(native, r)
			} else {
				alone = append(alone, r)
			}
		}
	}
	n := len(counts) - 1
	perWorker := 0.0
	if n > 0 {
		perWorker = (native[n].rssMB - native[0].rssMB - (alone[n].rssMB - alone[0].rssMB)) / float64(counts[n]-counts[0])
	}
	fmt.Printf("RSS the native filter adds to Envoy: %.1f MB fixed, %.1f MB per worker; threads it adds: %d at %d worker(s), %d at %d\n",
		native[0].rssMB-alone[0].rssMB-perWorker*float64(counts[0]), perWorker,
		native[0].threads-alone[0].threads, counts[0], native[n].threads-alone[n].threads, counts[n])
	return nil
}

// runtimeRun is one Envoy of runtimeCost.
type runtimeRun struct {
	workers              int
	filter               bool
	threads              int
	rssMB, rps           float64
	report               map[string]float64 // the module's (gostats.Report)
	gcs                  int                // from gctrace
	tracedP99, tracedMax float64            // gctrace's pauses, us
}

func (r runtimeRun) row() string {
	name := "none"
	if r.filter {
		name = "native"
	}
	rep := func(k string) string {
		if !r.filter {
			return "-"
		}
		return strconv.FormatFloat(r.report[k], 'f', 0, 64)
	}
	return fmt.Sprintf("%-7d %-7s %8d %8.1f %9.0f %5d %11s %11s %11.0f %11.0f %11s %11s %11s", r.workers, name, r.threads, r.rssMB, r.rps, r.gcs,
		rep("gc_pause_p99_us"), rep("gc_pause_max_us"), r.tracedP99, r.tracedMax, rep("hook_p50_us"), rep("hook_p99_us"), rep("hook_max_us"))
}

// runtimeRun starts the control plane and an Envoy of workers workers,
// with the native filter or none, runs the load and measures.
func (b *built) runtimeRun(ctx context.Context, rt string, cfg config, workers int, withFilter bool) (runtimeRun, error) {
	s := setups["1"]
	if withFilter {
		s = setups["7n"]
	}
	svc, err := b.startService(ctx, rt, s.rls, "")
	if err != nil {
		return runtimeRun{}, err
	}
	defer svc.stop()
	backend, err := stack.FreePort()
	if err != nil {
		return runtimeRun{}, err
	}
	name := fmt.Sprintf("runtime-%d-%v", workers, withFilter)
	e, err := stack.StartEnvoy(ctx, stack.EnvoyConfig{Binary: b.envoy, Dir: rt, Name: name, Bootstrap: s.bootstrap(b, backend, svc.addr),
		Concurrency: workers, LogLevel: "warning", Env: []string{"GODEBUG=gctrace=1"}})
	if err != nil {
		return runtimeRun{}, err
	}
	defer e.Stop()
	url := e.URL("ingress") + "/"
	if _, err := b.wrk(ctx, rt, url, loadSpread, cfg.connections, cfg.warmup); err != nil {
		return runtimeRun{}, err
	}
	logFrom := len(e.Log())
	w, err := b.wrk(ctx, rt, url, loadSpread, cfg.connections, cfg.duration)
	if err != nil {
		return runtimeRun{}, err
	}
	r := runtimeRun{workers: workers, filter: withFilter, rssMB: float64(e.RSS()) / (1 << 20),
		rps: float64(w.Requests) / (float64(w.DurationUS) / 1e6)}
	if tasks, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(e.PID()), "task")); err == nil {
		r.threads = len(tasks)
	}
	if withFilter {
		if r.report, err = runtimeReport(ctx, url); err != nil {
			return runtimeRun{}, err
		}
		r.gcs, r.tracedP99, r.tracedMax = stack.GCTracePauses(e.Log()[logFrom:])
	}
	return r, nil
}

// runtimeReport asks the module for its report.
func runtimeReport(ctx context.Context, url string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("x-sluice-test-runtime", "report")
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var rep map[string]float64
	if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil {
		return nil, fmt.Errorf("the module's runtime report: %w", err)
	}
	return rep, nil
}
