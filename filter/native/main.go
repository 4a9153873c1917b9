// Command native is sluice's filter as an Envoy dynamic module,
// libsluice.so, built with cgo: the request pipeline of package
// filter/core, the same one filter.wasm runs, on Envoy's dynamic module
// ABI (package dynmod):
//
//	go build -buildmode=c-shared -o libsluice.so ./filter/native     (or: make native)
//
// Envoy (1.40 or later) loads it with the envoy.filters.http.dynamic_modules
// filter, dynamic_module_config {name: sluice, do_not_close: true,
// metrics_namespace: wasmcustom}, filter_name "sluice", and filter_config
// the same plugin configuration JSON filter.wasm takes; its stats then have
// filter.wasm's names. A Go runtime cannot be unloaded (do_not_close), and
// only one may be loaded in an Envoy process: see docs/envoy.md.
//
// Envoy runs one Go runtime for all its worker threads. Each filter
// configuration has a core.Worker per worker thread (worker.go), each
// single-threaded under a lock of its own; the state the workers share
// (over-limit blocks, lease pools) is process memory (package
// envoystate). Streams are in stream.go, what the core does to them in
// actions.go, the control plane's answers in answer.go.
package main

import (
	"fmt"
	"strconv"
	"sync"

	"github.com/sluicehq/sluice/filter/core"
	"github.com/sluicehq/sluice/filter/core/config"
	"github.com/sluicehq/sluice/filter/native/envoystate"
	"github.com/sluicehq/sluice/filter/native/internal/dynmod"
)

func main() {}

func init() {
	dynmod.Register(newFilter)
	dynmod.SetPanicHandler(func(p dynmod.Panic) {
		dynmod.Logf(dynmod.LogCritical, "sluice: panic in %s (the stream goes on without the filter): %v\n%s", p.Hook, p.Value, p.Stack)
	})
}

// filterName is the filter_name the module answers to.
const filterName = "sluice"

// filter is one filter configuration: a worker per Envoy worker thread.
type filter struct {
	c       *dynmod.Config
	workers []*worker
	metrics metrics
	// domains are the per-Envoy states the workers use (main thread).
	mu      sync.Mutex
	domains map[string]*envoystate.Domain
}

// newFilter makes a configuration from the plugin configuration raw, on
// Envoy's main thread: a bad one is refused whole, naming its field.
func newFilter(c *dynmod.Config, name string, raw []byte) (_ dynmod.ConfigHandler, err error) {
	if name != filterName {
		return nil, unknownFilterError(name)
	}
	cfg, err := config.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("invalid plugin configuration: %w", err) // filter.wasm's words
	}
	f := &filter{c: c, domains: map[string]*envoystate.Domain{}}
	if err := f.metrics.define(c); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			f.Destroy()
		}
	}()
	n := max(1, dynmod.Concurrency())
	for i := range n {
		w := newWorker(f, i)
		f.workers = append(f.workers, w)
		ok := false
		w.fromElsewhere(func() { ok = w.core.Configure(raw) })
		if !ok {
			return nil, errRefused
		}
	}
	dynmod.Logf(dynmod.LogInfo, "sluice: configuration of domain %q accepted: %d rate limits, control plane cluster %s, %d workers",
		cfg.Domain, len(cfg.RateLimits), cfg.Cluster, n)
	return f, nil
}

// errRefused is the error of a configuration the core refused (it logged
// why).
var errRefused = unknownFilterError("") // (never: config.Parse refused it first)

// unknownFilterError is the error of a filter_name the module lacks.
type unknownFilterError string

func (e unknownFilterError) Error() string {
	if e == "" {
		return "sluice: the plugin configuration was refused"
	}
	return "sluice: no filter named " + string(e) + " (filter_name must be \"" + filterName + "\")"
}

// domain returns the per-Envoy state of domain for the workers.
func (f *filter) domain(name string) *envoystate.Domain {
	f.mu.Lock()
	defer f.mu.Unlock()
	d := f.domains[name]
	if d == nil {
		d = envoystate.Acquire(name)
		f.domains[name] = d
	}
	return d
}

// NewStream returns the handler of a stream, on its worker thread: the
// stream joins the core.Worker of that thread.
func (f *filter) NewStream(ds *dynmod.Stream) dynmod.StreamHandler {
	i := ds.WorkerIndex()
	if i < 0 || i >= len(f.workers) {
		dynmod.Log(dynmod.LogError, "sluice: a stream on worker "+strconv.Itoa(i)+" of "+strconv.Itoa(len(f.workers))+": let through")
		return nil
	}
	w := f.workers[i]
	s := &stream{ds: ds, w: w}
	ds.Skip(dynmod.HookRequestTrailers) // let through, unread
	w.enter()
	defer w.leave()
	s.x = w.core.Open(s)
	return (*hooks)(s)
}

// Destroy stops the workers and releases the per-Envoy state, on the main
// thread, once no stream uses the configuration.
func (f *filter) Destroy() {
	for _, w := range f.workers {
		w.stop()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for name, d := range f.domains {
		d.Release()
		delete(f.domains, name)
	}
}

// metrics are the stats of a configuration: every one the core may use
// (core.Metrics), defined when the configuration is made, since Envoy
// takes no definition later.
type metrics struct {
	ids      map[string]uint32 // by name: index+1 into kinds
	kinds    []core.MetricKind
	counters []dynmod.Counter
	gauges   []dynmod.Gauge
}

// define defines core.Metrics.
func (m *metrics) define(c *dynmod.Config) error {
	m.ids = map[string]uint32{}
	for _, d := range core.Metrics {
		var ctr dynmod.Counter
		var g dynmod.Gauge
		var err error
		if d.Kind == core.Gauge {
			g, err = c.DefineGauge(d.Name)
		} else {
			ctr, err = c.DefineCounter(d.Name)
		}
		if err != nil {
			return err
		}
		m.kinds, m.counters, m.gauges = append(m.kinds, d.Kind), append(m.counters, ctr), append(m.gauges, g)
		m.ids[d.Name] = uint32(len(m.kinds))
	}
	return nil
}

// id returns the id of metric name.
func (m *metrics) id(kind core.MetricKind, name string) (uint32, error) {
	id, ok := m.ids[name]
	if !ok || m.kinds[id-1] != kind {
		return 0, errUndefined(name)
	}
	return id, nil
}

// errUndefined is the error of a metric the configuration did not define.
type errUndefined string

func (e errUndefined) Error() string {
	return "metric " + string(e) + " was not defined with the configuration"
}

// add adds delta to metric id.
func (m *metrics) add(id uint32, delta int64) {
	if id == 0 || int(id) > len(m.kinds) {
		return
	}
	i := id - 1
	switch {
	case m.kinds[i] == core.Counter && delta > 0:
		m.counters[i].Add(uint64(delta))
	case m.kinds[i] == core.Gauge && delta > 0:
		m.gauges[i].Add(uint64(delta))
	case m.kinds[i] == core.Gauge && delta < 0:
		m.gauges[i].Sub(uint64(-delta))
	}
}
