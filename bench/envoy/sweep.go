package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/e2e/stack"
	"github.com/sluicehq/sluice/envoy"
)

// The worker sweep: the shipped envoy/envoy.yaml (filter.wasm) and
// envoy/envoy-native.yaml (libsluice.so), unchanged but for their addresses
// and the filter's path, at several --concurrency values, with the workers
// sharing their state (the default) and with shared_state off (each on its
// own, as before sharing). Its load is a paced flood: one
// API key sent at 10x its limit from keep-alive connections that the kernel
// spreads over the workers. What it counts apart: the calls the control
// plane answered OVER_LIMIT (those a precheck that knew what any worker had
// learnt would have saved) and the admitted calls (one per admitted request
// at any worker count).

// sweepPolicy is the flood key's limit, in the shipped configuration's
// domain; its other descriptors (remote address, path) match no limit.
const sweepPolicy = `domain: sluice-demo
descriptors:
  - key: api_key
    value: hot
    rate_limit: {unit: second, requests_per_unit: 50}
`

// sweepKey is the flooded API key.
const sweepKey = "hot"

// The sweep's loads, both paced at -flood-rate.
const (
	// sweepFlood is every request on sweepKey, 10x its limit.
	sweepFlood = "flood"
	// sweepSpread is 10,000 keys that match no limit: every request calls
	// the control plane, and with shared state every VM first reads the
	// shared store for each of its three descriptors (the store's most
	// expensive case).
	sweepSpread = "spread"
)

// sweepCase is one Envoy of the sweep under one load.
type sweepCase struct {
	host    string // sweepWasm or sweepNative
	workers int
	shared  bool
	load    string
}

// The sweep's hosts of the filter, and their goals: OVER_LIMIT calls per
// request at the most workers at most this many times those at the fewest.
const (
	sweepWasm   = "wasm"
	sweepNative = "native"
)

var sweepGoal = map[string]float64{sweepWasm: 1.25, sweepNative: 1.1}

func (c sweepCase) String() string {
	s := "shared"
	if !c.shared {
		s = "per-VM"
	}
	return fmt.Sprintf("%s %s c=%d %s", c.host, c.load, c.workers, s)
}

// key returns the x-api-key of request i of the case's load.
func (c sweepCase) key(i int) string {
	if c.load == sweepSpread {
		return "u" + strconv.Itoa(i%10000)
	}
	return sweepKey
}

// sweepResult is what one flood through one Envoy measured.
type sweepResult struct {
	sent, ok, limited, other    float64
	allowed, overLimit          float64 // control-plane answers, by the filter's counters
	precheck, shared            float64 // local 429s; those on a block another VM learnt
	casRetries, lost, errs      float64 // shared writes retried and not shared; failed calls
	failOpen                    float64 // failed calls whose request went through
	envoyUS                     float64 // Envoy CPU per request, us
	seconds                     float64 // the flood's real length
	perWorker                   []int64 // connections each worker accepted
	overPerReq, allowedPerReq   float64
	precheckShare, sharedOfPrec float64
}

// parseWorkers reads "1,2,4,8".
func parseWorkers(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 || n > 64 {
			return nil, fmt.Errorf("-sweep: %q is not a worker count (1-64)", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// sweep runs the worker sweep: cfg.runs interleaved runs of every case,
// then the medians and the goals.
func (b *built) sweep(ctx context.Context, dir string, cfg config, workers []int) error {
	var cases []sweepCase
	for _, h := range strings.Split(cfg.sweepHosts, ",") {
		h = strings.TrimSpace(h)
		if h != sweepWasm && h != sweepNative {
			return fmt.Errorf("-sweep-hosts: no host %q (wasm, native)", h)
		}
		for _, l := range strings.Split(cfg.sweepLoads, ",") {
			l = strings.TrimSpace(l)
			if l != sweepFlood && l != sweepSpread {
				return fmt.Errorf("-sweep-loads: no load %q (flood, spread)", l)
			}
			for _, w := range workers {
				cases = append(cases, sweepCase{h, w, true, l}, sweepCase{h, w, false, l})
			}
		}
	}
	fmt.Printf("worker sweep: envoy/envoy.yaml (wasm) and envoy/envoy-native.yaml (native) at %d requests/s for %v from %d keep-alive connections, sluice-controlplane on Redis; "+
		"flood: API key %q on a limit of 50/s; spread: 10,000 keys under no limit\n",
		cfg.floodRate, cfg.floodDuration, cfg.floodConns, sweepKey)
	fmt.Println(sweepHeader())
	results := map[sweepCase][]sweepResult{}
	err := interleave(ctx, cfg.runs, cases, func(c sweepCase, r int) error {
		res, err := b.flood(ctx, dir, cfg, c)
		if err != nil {
			return fmt.Errorf("sweep %v run %d: %w", c, r, err)
		}
		fmt.Println(res.row(c, strconv.Itoa(r)))
		results[c] = append(results[c], res)
		return nil
	})
	if err != nil {
		return err
	}
	fmt.Printf("\nworker sweep, medians of %d runs:\n", cfg.runs)
	fmt.Println(sweepHeader())
	med := map[sweepCase]sweepResult{}
	for _, c := range cases {
		med[c] = sweepMedian(results[c])
		fmt.Println(med[c].row(c, "med"))
	}
	fmt.Println()
	for _, c := range cases {
		if !c.shared {
			continue
		}
		one, ok := med[sweepCase{c.host, workers[0], true, c.load}]
		m, off := med[c], med[sweepCase{c.host, c.workers, false, c.load}]
		line := fmt.Sprintf("%s %s c=%d: OVER_LIMIT calls per request %.4f shared vs %.4f per-VM", c.host, c.load, c.workers, m.overPerReq, off.overPerReq)
		if ok && c.load == sweepFlood && c.workers != workers[0] && one.overPerReq > 0 {
			line += fmt.Sprintf("; %.2fx those at %d worker(s) (goal <= %.2fx; per-VM %.2fx)", m.overPerReq/one.overPerReq,
				workers[0], sweepGoal[c.host], off.overPerReq/med[sweepCase{c.host, workers[0], false, c.load}].overPerReq)
		}
		line += fmt.Sprintf("; Envoy CPU %.1f vs %.1f us per request (%+.1f us); %.0f CAS retries, %.0f blocks not shared",
			m.envoyUS, off.envoyUS, m.envoyUS-off.envoyUS, m.casRetries, m.lost)
		fmt.Println(line)
	}
	return nil
}

// flood starts the control plane and one Envoy of case c, and measures one
// flood.
func (b *built) flood(ctx context.Context, dir string, cfg config, c sweepCase) (sweepResult, error) {
	svc, err := b.startService(ctx, dir, rlsSluice, sweepPolicy)
	if err != nil {
		return sweepResult{}, err
	}
	defer svc.stop()
	up, err := stack.StartUpstream("127.0.0.1:0", "")
	if err != nil {
		return sweepResult{}, err
	}
	defer up.Close(context.Background())
	text, local, env := envoy.Config, envoy.Local{Wasm: b.filterWasm}, []string(nil)
	if c.host == sweepNative {
		text, local, env = envoy.NativeConfig, envoy.Local{}, []string{stack.ModuleSearchPath(filepath.Dir(b.nativeModule))}
	}
	local.Listen, local.ControlPlane, local.Backend = "127.0.0.1:0", svc.addr, up.Addr()
	boot, err := local.Bootstrap(text)
	if err != nil {
		return sweepResult{}, err
	}
	if !c.shared {
		if err := setPluginField(boot, "shared_state", false); err != nil {
			return sweepResult{}, err
		}
	}
	e, err := stack.StartEnvoy(ctx, stack.EnvoyConfig{Binary: b.envoy, Dir: dir,
		Name: fmt.Sprintf("sweep-%s-%s-%d-%v", c.host, c.load, c.workers, c.shared), Bootstrap: boot, Concurrency: c.workers, LogLevel: "warning",
		Env: env})
	if err != nil {
		return sweepResult{}, err
	}
	defer e.Stop()
	url := e.URL(envoy.ListenerName) + "/"
	// Warm-up: every connection once, on a key of its own, so that the
	// flood does not pay for connections (to Envoy, and Envoy's to the
	// control plane and the upstream).
	if _, err := pacedLoad(ctx, url, cfg.floodConns, cfg.floodConns, 2*cfg.floodConns, func(n int) string { return "warm" + strconv.Itoa(n) }); err != nil {
		return sweepResult{}, fmt.Errorf("warm-up: %w", err)
	}
	s0, err := e.Stats()
	if err != nil {
		return sweepResult{}, err
	}
	cpu0 := stack.ProcCPU(e.PID())
	n := int(float64(cfg.floodRate) * cfg.floodDuration.Seconds())
	start := time.Now()
	codes, err := pacedLoad(ctx, url, n, cfg.floodConns, cfg.floodRate, c.key)
	if err != nil {
		return sweepResult{}, err
	}
	r := sweepResult{seconds: time.Since(start).Seconds()}
	cpu1 := stack.ProcCPU(e.PID())
	s1, err := e.Stats()
	if err != nil {
		return sweepResult{}, err
	}
	d := func(name string) float64 {
		return float64(s1["wasmcustom.sluice."+name] - s0["wasmcustom.sluice."+name])
	}
	r.sent = float64(n)
	r.ok, r.limited, r.other = float64(codes[200]), float64(codes[429]), float64(n-codes[200]-codes[429])
	r.allowed, r.overLimit = d("allowed"), d("over_limit")
	r.precheck, r.shared = d("precheck_rejected"), d("precheck_shared")
	r.casRetries, r.lost, r.errs, r.failOpen = d("shared_cas_retries"), d("shared_lost"), d("errors"), d("failure_open")
	r.envoyUS = float64((cpu1 - cpu0).Microseconds()) / r.sent
	r.perWorker = connsPerWorker(s1, c.workers)
	r.derive()
	return r, nil
}

// derive computes the ratios.
func (r *sweepResult) derive() {
	r.overPerReq, r.allowedPerReq = r.overLimit/r.sent, r.allowed/r.sent
	if r.limited > 0 {
		r.precheckShare = r.precheck / r.limited
	}
	if r.precheck > 0 {
		r.sharedOfPrec = r.shared / r.precheck
	}
}

// connsPerWorker returns the connections each worker of the ingress
// listener accepted.
func connsPerWorker(s map[string]int64, workers int) []int64 {
	out := make([]int64, workers)
	for w := range workers {
		suffix := ".worker_" + strconv.Itoa(w) + ".downstream_cx_total"
		for name, v := range s {
			if strings.HasPrefix(name, "listener.127.0.0.1_") && strings.HasSuffix(name, suffix) {
				out[w] += v
			}
		}
	}
	return out
}

// pacedLoad sends n requests to url at rate per second from conns
// keep-alive connections (request i is due at start + i/rate; connection c
// sends every conns-th), the x-api-key of request i being key(i), and
// returns the count of each status. A connection that falls behind sends
// at once.
func pacedLoad(ctx context.Context, url string, n, conns, rate int, key func(int) string) (map[int]int, error) {
	var mu sync.Mutex
	codes := map[int]int{}
	var failed atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	for c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tr := &http.Transport{MaxIdleConnsPerHost: 1, MaxConnsPerHost: 1}
			defer tr.CloseIdleConnections()
			client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
			for i := c; i < n && ctx.Err() == nil; i += conns {
				time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate))))
				req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
				req.Header.Set("x-api-key", key(i))
				resp, err := client.Do(req)
				if err != nil {
					failed.CompareAndSwap(nil, err)
					return
				}
				io.Copy(io.Discard, resp.Body) // so that the connection is reused
				resp.Body.Close()
				mu.Lock()
				codes[resp.StatusCode]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		return nil, err
	}
	return codes, ctx.Err()
}

// setPluginField sets field of the JSON plugin configuration of every
// sluice filter in bootstrap boot (a google.protobuf.StringValue's value: a
// Wasm filter's configuration, a dynamic module's filter_config).
func setPluginField(boot map[string]any, field string, v any) error {
	found := 0
	var failed error
	var walk func(any)
	walk = func(x any) {
		switch m := x.(type) {
		case map[string]any:
			conf, ok := m["configuration"].(map[string]any)
			if !ok {
				conf, ok = m["filter_config"].(map[string]any)
			}
			if ok {
				if s, ok := conf["value"].(string); ok {
					var doc map[string]any
					if err := json.Unmarshal([]byte(s), &doc); err != nil {
						failed = fmt.Errorf("plugin configuration: %w", err)
						return
					}
					doc[field] = v
					js, _ := json.Marshal(doc)
					conf["value"] = string(js)
					found++
				}
			}
			for _, y := range m {
				walk(y)
			}
		case []any:
			for _, y := range m {
				walk(y)
			}
		}
	}
	walk(boot)
	if failed == nil && found == 0 {
		failed = fmt.Errorf("no plugin configuration in the bootstrap")
	}
	return failed
}

func sweepHeader() string {
	return fmt.Sprintf("%-28s %-4s %6s %6s %6s %9s %9s %8s %8s %7s %7s %6s %6s %9s %s",
		"case", "run", "sent", "200", "429", "over/req", "allow/req", "prec%", "shared%", "casRtr", "lost", "errs", "secs", "envoy_us", "conns/worker")
}

func (r sweepResult) row(c sweepCase, run string) string {
	return fmt.Sprintf("%-28s %-4s %6.0f %6.0f %6.0f %9.4f %9.4f %8.1f %8.1f %7.0f %7.0f %6.0f %6.1f %9.1f %v",
		c, run, r.sent, r.ok, r.limited, r.overPerReq, r.allowedPerReq, 100*r.precheckShare, 100*r.sharedOfPrec,
		r.casRetries, r.lost, r.errs, r.seconds, r.envoyUS, r.perWorker)
}

// sweepMedian returns the field-wise median of the runs (the connections
// per worker of the first run).
func sweepMedian(rs []sweepResult) sweepResult {
	f := func(get func(sweepResult) float64) float64 { return medianOf(rs, get) }
	m := sweepResult{
		sent: f(func(r sweepResult) float64 { return r.sent }), ok: f(func(r sweepResult) float64 { return r.ok }),
		limited: f(func(r sweepResult) float64 { return r.limited }), other: f(func(r sweepResult) float64 { return r.other }),
		allowed: f(func(r sweepResult) float64 { return r.allowed }), overLimit: f(func(r sweepResult) float64 { return r.overLimit }),
		precheck: f(func(r sweepResult) float64 { return r.precheck }), shared: f(func(r sweepResult) float64 { return r.shared }),
		casRetries: f(func(r sweepResult) float64 { return r.casRetries }), lost: f(func(r sweepResult) float64 { return r.lost }),
		errs: f(func(r sweepResult) float64 { return r.errs }), failOpen: f(func(r sweepResult) float64 { return r.failOpen }),
		envoyUS: f(func(r sweepResult) float64 { return r.envoyUS }), seconds: f(func(r sweepResult) float64 { return r.seconds }),
	}
	if len(rs) > 0 {
		m.perWorker = rs[0].perWorker
	}
	m.derive()
	return m
}

// loadAverage returns /proc/loadavg's first three fields.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
