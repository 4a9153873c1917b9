package main

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/sluicehq/sluice/e2e/stack"
)

// memoryWorkers are the --concurrency values the memory section compares:
// Envoy runs one Wasm VM per worker plus one on its main thread (or, native,
// one worker of the filter per worker thread in one Go runtime), so the
// RSS a filter costs per worker is the slope over worker counts, and what
// is left at one worker is the fixed cost of the runtime and the module.
var memoryWorkers = []int{1, 2, 4}

// memory prints Envoy's RSS after 200 requests with no filter, the empty Go
// filter and sluice's, at each of memoryWorkers, and the per-worker slope.
func (b *built) memory(ctx context.Context, dir string) error {
	fmt.Println("Envoy RSS (MB) after 200 requests, by --concurrency:")
	fmt.Printf("%-22s", "filter")
	for _, w := range memoryWorkers {
		fmt.Printf(" %8s", fmt.Sprintf("c=%d", w))
	}
	fmt.Printf(" %14s %14s\n", "per worker", "fixed vs none")
	var base []float64
	for _, f := range []struct{ name, path string }{{"none", ""}, {"empty Go filter", b.emptyWasm},
		{"empty native module", b.floorModule}, {"sluice filter", b.filterWasm}, {"sluice native filter", b.nativeModule}} {
		var rss []float64
		for _, w := range memoryWorkers {
			r, err := b.idleRSS(ctx, dir, f.path, w)
			if err != nil {
				return fmt.Errorf("memory, %s, concurrency %d: %w", f.name, w, err)
			}
			rss = append(rss, r)
		}
		if base == nil {
			base = rss
		}
		n := len(memoryWorkers) - 1
		slope := (rss[n] - rss[0] - (base[n] - base[0])) / float64(memoryWorkers[n]-memoryWorkers[0])
		fmt.Printf("%-22s", f.name)
		for _, r := range rss {
			fmt.Printf(" %8.1f", r)
		}
		fmt.Printf(" %14.1f %14.1f\n", slope, rss[0]-base[0]-slope)
	}
	fmt.Println("(per worker: the RSS slope over worker counts, against no filter's; goal <= 25 MB. Fixed: the rest at one worker, paid once per Envoy: V8 and the compiled module, or the Go runtime)")
	return nil
}

// idleRSS starts Envoy with the filter at path ("" for none) and workers
// worker threads, sends it 200 requests, and returns its RSS in MB.
func (b *built) idleRSS(ctx context.Context, dir, path string, workers int) (float64, error) {
	var filters []stack.M
	switch path {
	case "":
	case b.emptyWasm:
		filters = append(filters, wasmFilter(path, []byte("{}")))
	case b.floorModule:
		filters = append(filters, floorModule("{}"))
	case b.nativeModule:
		filters = sluiceNative(b)
	default:
		filters = sluiceFilter(b)
	}
	e, err := stack.StartEnvoy(ctx, stack.EnvoyConfig{
		Binary: b.envoy, Dir: dir, Name: fmt.Sprintf("memory-%d", workers), Concurrency: workers, LogLevel: "warning",
		Bootstrap: stack.Bootstrap(
			[]stack.M{stack.HTTPListener("ingress", 0, []stack.M{stack.VirtualHost("ingress",
				stack.DirectResponse("/", 200, "ok\n"))}, filters...)},
			[]stack.M{stack.GRPCCluster(rlsCluster, "127.0.0.1:1")}), // no service: the filter fails open
	})
	if err != nil {
		return 0, err
	}
	defer e.Stop()
	client := &http.Client{Timeout: 5 * time.Second}
	for i := 0; i < 200; i++ {
		req, _ := http.NewRequestWithContext(ctx, "GET", e.URL("ingress")+"/", nil)
		req.Header.Set(userHeader, fmt.Sprintf("u%d", i))
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
		}
	}
	time.Sleep(time.Second) // let the workers settle after the last request
	return float64(e.RSS()) / (1 << 20), nil
}
