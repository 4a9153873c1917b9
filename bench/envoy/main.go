// Command bench-envoy measures sluice in real Envoy against Envoy alone, an
// empty upstream-Go Wasm filter, Envoy's own (C++) local_ratelimit, and Envoy's
// own ratelimit filter with envoyproxy/ratelimit: `make bench-envoy`. It is
// a benchmark, not a test.
//
// Every setup runs on the same Envoy binary with the same --concurrency, in
// front of the same upstream: a second listener of the same Envoy that
// answers with direct_response (cheap, and still a route entry on the first
// listener, so Envoy's ratelimit filter runs). The load generator is wrk
// (Debian's package) with a Lua script that picks each request's key. Runs
// are interleaved (odd runs in setup order, even runs reversed) and the
// table gives medians. For each run it reports requests/s, p50/p99 latency,
// and the CPU seconds per request (from /proc, user plus system) of Envoy, of
// the rate limit service and of Redis.
//
// Setups 2ne, 2nr and 2n are the native floors: an empty Envoy dynamic
// module in Go (filter/native/internal/emptymodule) that continues, answers
// 429, or makes setup 2h's callout over the dynamic module HTTP callout;
// setup 2nc is 2ne in C (cfloor/floor.c), with no Go runtime behind the
// hooks.
// Setups 7n, 4n and 7Ln are 7, 4 and 7L with the native filter
// (libsluice.so) in place of filter.wasm (native.go).
//
// Setups 7p4, L4, 7p64, L64, 7s and Ls are the LLM row (llm.go): reading
// a chat request body for its reserve, and an SSE answer for its usage,
// against the same traffic passed on unread. -overshoot prints instead the
// overshoot table of 64 concurrent LLM streams on five paths
// (overshoot.go).
//
// Setups u and u1 measure usage-based limits: the backend
// reports a usage per answer, the filter settles it at the end of each
// stream, batched (u, the default settle configuration) or one call per
// settlement (u1); against setup 7 they give what settlements cost.
//
//	bench-envoy [-runs 3] [-duration 10s] [-warmup 2s] [-concurrency 2] [-connections 32] [-setups 1,1d,2,2r,2h,2g,2n,3,4,5,6,6f,7,7g,u,u1,7p4,L4,7p64,L64,7s,Ls]
//	            [-loads spread,flood,steady,unique] [-filter-stats]
//	bench-envoy -overshoot [-runs 3]
//	            [-base-wasm filter.wasm (setup 7b)] [-base-native libsluice.so (setups 7nb, 7Lnb)]
//	            [-sweep 1,2,4,8] [-sweep-loads flood,spread] [-flood-rate 500] [-flood-duration 5s] [-flood-conns 32]
//
// Then the worker sweep (sweep.go): the shipped envoy/envoy.yaml at each
// -sweep --concurrency, with the VMs sharing their state and with
// shared_state off, under a paced flood of one key at 10x its limit.
//
// Run it from the repository (it builds what it runs).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/e2e/stack"
)

func main() {
	var cfg config
	flag.IntVar(&cfg.runs, "runs", 3, "interleaved runs of every setup and load")
	flag.DurationVar(&cfg.duration, "duration", 10*time.Second, "measured time of one run")
	flag.DurationVar(&cfg.warmup, "warmup", 2*time.Second, "unmeasured load before each run")
	flag.IntVar(&cfg.concurrency, "concurrency", 2, "Envoy worker threads (one Wasm VM each)")
	flag.IntVar(&cfg.connections, "connections", 32, "wrk connections")
	flag.StringVar(&cfg.setups, "setups", "1,1d,2,2r,2h,2g,2n,3,4,5,6,6f,7,7g,u,u1,7p4,L4,7p64,L64,7s,Ls", "setups to run (see the setups table in setups.go, and llm.go)")
	flag.StringVar(&cfg.loads, "loads", "spread,flood", "loads for setups 5-7L: spread, flood, steady, unique")
	flag.BoolVar(&cfg.filterStats, "filter-stats", false, "print the filter's counters per request after each run (renewals, grants, waits)")
	flag.BoolVar(&cfg.keep, "keep", false, "keep the work directory (logs, bootstraps)")
	flag.BoolVar(&cfg.memory, "memory", true, "measure Envoy's RSS per worker with and without the filters")
	flag.StringVar(&cfg.sweep, "sweep", "1,2,4,8", "worker counts of the worker sweep (\"\": none)")
	flag.IntVar(&cfg.floodRate, "flood-rate", 500, "worker sweep: requests per second of the flood (its key's limit is 50/s)")
	flag.DurationVar(&cfg.floodDuration, "flood-duration", 5*time.Second, "worker sweep: length of one flood")
	flag.IntVar(&cfg.floodConns, "flood-conns", 32, "worker sweep: keep-alive connections of the flood")
	flag.StringVar(&cfg.baseWasm, "base-wasm", "", "filter.wasm of setup 7b: setup 7 with this build (of another revision), for an A/B in one run")
	flag.StringVar(&cfg.baseNative, "base-native", "", "libsluice.so of setups 7nb and 7Lnb: 7n and 7Ln with this build (of another revision), for an A/B in one run")
	flag.StringVar(&cfg.sweepLoads, "sweep-loads", "flood,spread", "worker sweep: loads (flood: one key at 10x its limit; spread: 10,000 keys under no limit)")
	flag.StringVar(&cfg.sweepHosts, "sweep-hosts", "wasm,native", "worker sweep: the filter's hosts (wasm: envoy/envoy.yaml; native: envoy/envoy-native.yaml)")
	flag.StringVar(&cfg.runtime, "runtime", "", "instead of the setups: what the Go runtime costs inside Envoy with the native filter under load, at these worker counts (e.g. 1,2,4; runtime.go)")
	flag.BoolVar(&cfg.overshoot, "overshoot", false, "print the LLM overshoot table (overshoot.go) instead of the setups")
	flag.BoolVar(&cfg.overshootPeer, "overshoot-peer", true, "the overshoot table's envoyproxy/ratelimit path (it builds envoyproxy/ratelimit)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "bench-envoy:", err)
		os.Exit(1)
	}
}

type config struct {
	runs                     int
	duration, warmup         time.Duration
	concurrency, connections int
	setups, loads            string
	keep, memory             bool
	filterStats              bool   // -filter-stats
	baseWasm                 string // setup 7b's filter.wasm
	baseNative               string // setups 7nb and 7Lnb's libsluice.so
	overshoot, overshootPeer bool   // the LLM overshoot table only, with envoyproxy/ratelimit's path
	// The worker sweep (sweep.go).
	sweep, sweepLoads     string
	sweepHosts            string
	runtime               string // -runtime: worker counts of the Go runtime's cost
	floodRate, floodConns int
	floodDuration         time.Duration
}

func run(ctx context.Context, cfg config) error {
	dir, err := os.MkdirTemp("", "sluice-bench-envoy-")
	if err != nil {
		return err
	}
	if cfg.keep {
		fmt.Println("work directory:", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	workers, err := parseWorkers(cfg.sweep)
	if err != nil {
		return err
	}
	if cfg.overshoot {
		b, err := build(ctx, dir, cfg.overshootPeer)
		if err != nil {
			return err
		}
		redis, err := stack.StartRedis(ctx, dir)
		if err != nil {
			return err
		}
		defer redis.Stop()
		b.redis = redis
		return b.overshoot(ctx, dir, cfg)
	}
	var cases []benchCase
	peer := false
	for _, id := range strings.Split(cfg.setups, ",") {
		if strings.TrimSpace(id) == "" {
			continue
		}
		s, ok := setups[strings.TrimSpace(id)]
		if !ok {
			return fmt.Errorf("no setup %q", id)
		}
		peer = peer || s.rls == rlsPeer
		if s.id == "7b" && cfg.baseWasm == "" {
			return fmt.Errorf("setup 7b needs -base-wasm")
		}
		if (s.id == "7nb" || s.id == "7Lnb") && cfg.baseNative == "" {
			return fmt.Errorf("setup %s needs -base-native", s.id)
		}
		if s.load != "" {
			cases = append(cases, benchCase{setup: s, load: s.load})
			continue
		}
		for _, l := range strings.Split(cfg.loads, ",") {
			cases = append(cases, benchCase{setup: s, load: load(strings.TrimSpace(l))})
		}
	}
	b, err := build(ctx, dir, peer)
	if err != nil {
		return err
	}
	b.baseWasm = cfg.baseWasm
	if cfg.baseNative != "" {
		so, err := os.ReadFile(cfg.baseNative)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "lib"+baseNativeName+".so"), so, 0o755); err != nil {
			return err
		}
	}
	redis, err := stack.StartRedis(ctx, dir)
	if err != nil {
		return err
	}
	defer redis.Stop()
	b.redis = redis
	if cfg.runtime != "" {
		return b.runtimeCost(ctx, dir, cfg)
	}

	fmt.Printf("Envoy %s, --concurrency %d; wrk -t1 -c%d, %v per run after %v warm-up; %d cores shared by wrk, Envoy, the service and Redis\n",
		b.envoyVersion, cfg.concurrency, cfg.connections, cfg.duration, cfg.warmup, numCPU())
	fmt.Println()
	fmt.Println(header())
	results := map[string][]result{}
	err = interleave(ctx, cfg.runs, cases, func(c benchCase, r int) error {
		res, err := b.measure(ctx, dir, cfg, c)
		if err != nil {
			return fmt.Errorf("setup %s %s run %d: %w", c.setup.id, c.load, r, err)
		}
		fmt.Println(res.row(c, strconv.Itoa(r)))
		results[c.key()] = append(results[c.key()], res)
		return nil
	})
	if err != nil {
		return err
	}
	fmt.Println()
	fmt.Printf("medians of %d runs:\n", cfg.runs)
	fmt.Println(header())
	med := map[string]result{}
	for _, c := range cases {
		m := median(results[c.key()])
		med[c.key()] = m
		fmt.Println(m.row(c, "med"))
	}
	fmt.Println()
	summarize(med, cfg.concurrency)
	if len(workers) > 0 {
		fmt.Printf("\nload average before the sweep: %s\n", loadAverage())
		if err := b.sweep(ctx, dir, cfg, workers); err != nil {
			return err
		}
		fmt.Printf("load average after the sweep: %s\n", loadAverage())
	}
	if cfg.memory {
		fmt.Println()
		return b.memory(ctx, dir)
	}
	return nil
}

// numCPU returns the cores this process may use.
func numCPU() int {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	return strings.Count(string(b), "\nprocessor") + 1
}

// built is what a run needs: programs, and the shared Redis.
type built struct {
	controlPlane, peer, floor, filterWasm, emptyWasm string
	floorModule                                      string         // the native floor, lib<floorModuleName>.so
	cFloorModule                                     string         // the native floor in C, lib<cFloorModuleName>.so
	nativeModule                                     string         // the native filter, libsluice.so in the work directory
	baseWasm                                         string         // setup 7b's (-base-wasm)
	sseBackend                                       string         // the LLM setups' SSE backend (llm.go)
	bodies                                           map[int]string // the LLM setups' request bodies, by size
	envoy, envoyVersion                              string
	redis                                            *stack.Redis
}

// build compiles what the setups run; envoyproxy/ratelimit only when peer.
func build(ctx context.Context, dir string, peer bool) (*built, error) {
	root, err := stack.ModuleRoot(ctx)
	if err != nil {
		return nil, err
	}
	b := &built{
		controlPlane: filepath.Join(dir, "sluice-controlplane"),
		peer:         filepath.Join(dir, "ratelimit-peer"),
		floor:        filepath.Join(dir, "rlsfloor"),
		filterWasm:   filepath.Join(dir, "filter.wasm"),
		emptyWasm:    filepath.Join(dir, "empty.wasm"),
	}
	fmt.Println("building sluice-controlplane, filter.wasm, the native filter, the empty Go filter, the native floor and envoyproxy/ratelimit ...")
	if err := stack.GoBuild(ctx, "./controlplane/cmd/sluice-controlplane", b.controlPlane); err != nil {
		return nil, err
	}
	if err := stack.GoBuild(ctx, "./controlplane/cmd/rlsfloor", b.floor); err != nil {
		return nil, err
	}
	if err := stack.BuildWasm(ctx, b.filterWasm); err != nil {
		return nil, err
	}
	if err := command(ctx, root, []string{"GOOS=wasip1", "GOARCH=wasm"}, "go", "build", "-buildmode=c-shared",
		"-trimpath", "-ldflags=-s -w", "-o", b.emptyWasm, "./bench/envoy/emptyfilter"); err != nil {
		return nil, err
	}
	if b.floorModule, err = stack.BuildNativeModule(ctx, "./filter/native/internal/emptymodule", dir, floorModuleName); err != nil {
		return nil, err
	}
	b.cFloorModule = filepath.Join(dir, "lib"+cFloorModuleName+".so")
	if err := command(ctx, root, nil, "gcc", "-shared", "-fPIC", "-O2", "-I", "filter/native/internal/dynmod",
		"-o", b.cFloorModule, "bench/envoy/cfloor/floor.c"); err != nil {
		return nil, err
	}
	b.nativeModule = filepath.Join(dir, "libsluice.so")
	if err := stack.BuildNative(ctx, b.nativeModule); err != nil {
		return nil, err
	}
	if peer {
		if err := command(ctx, filepath.Join(root, "bench", "ratelimit-peer"), nil, "go", "build", "-o", b.peer, "."); err != nil {
			return nil, err
		}
	}
	if b.envoy, err = stack.EnvoyBinary(ctx); err != nil {
		return nil, err
	}
	out, err := output(ctx, "", b.envoy, "--version")
	if err != nil {
		return nil, err
	}
	b.envoyVersion = envoyVersion(out)
	if _, err := lookWrk(); err != nil {
		return nil, err
	}
	if b.sseBackend, err = startSSEBackend(); err != nil {
		return nil, err
	}
	b.bodies = map[int]string{}
	for _, n := range []int{4 << 10, 64 << 10} {
		if b.bodies[n], err = writeLLMBody(dir, n); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// envoyVersion picks "1.40.0" out of `envoy --version`.
func envoyVersion(out string) string {
	for _, f := range strings.Split(out, "/") {
		if n := strings.Count(f, "."); n == 2 && f != "" && f[0] >= '0' && f[0] <= '9' {
			return f
		}
	}
	return strings.TrimSpace(out)
}

// interleave runs every case runs times, odd runs in the order of cases
// and even runs reversed, so that a drift of the machine over the whole
// benchmark weighs on every case alike; it stops at the first error or
// when ctx ends.
func interleave[C any](ctx context.Context, runs int, cases []C, run func(c C, r int) error) error {
	for r := 1; r <= runs; r++ {
		order := slices.Clone(cases)
		if r%2 == 0 {
			slices.Reverse(order)
		}
		for _, c := range order {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := run(c, r); err != nil {
				return err
			}
		}
	}
	return nil
}
