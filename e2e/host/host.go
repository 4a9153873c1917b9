package host

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

// Config configures a Host. The zero value of every optional field picks the
// default named in its comment.
type Config struct {
	// Wasm is the module; when nil, WasmPath is read.
	Wasm []byte
	// WasmPath is the file to load when Wasm is nil.
	WasmPath string
	// PluginConfig is the plugin configuration handed to proxy_on_configure
	// (Envoy's PluginConfig.configuration), e.g. the filter's JSON.
	PluginConfig []byte
	// VMConfig is the VM configuration handed to proxy_on_vm_start.
	VMConfig []byte
	// PluginName is reported by the plugin_name property (default "sluice").
	PluginName string
	// RootID is reported by the plugin_root_id property (default "").
	RootID string
	// VMID is reported by the plugin_vm_id property (default "").
	VMID string
	// Workers is the number of VMs, one per worker like Envoy's worker
	// threads (default 2).
	Workers int
	// Clusters maps a cluster name, as passed to proxy_http_call, to the
	// "host:port" address it is served on. Calls speak HTTP/2 over cleartext.
	Clusters map[string]string
	// CompilationCacheDir, when set, keeps wazero's compiled code on disk so a
	// second load of the same module skips compilation.
	CompilationCacheDir string
	// LogLevel is the level proxy_get_log_level reports; guest log lines
	// below it are dropped: "trace", "debug", "info", "warn", "error" or
	// "critical" (default "info").
	LogLevel string
	// Logger receives the guest's log lines and the host's own (default
	// slog.Default()).
	Logger *slog.Logger
	// PauseTimeout bounds how long a stream paused by the filter waits for
	// proxy_continue_stream or proxy_send_local_response before the host
	// answers 408 "stream timeout", as Envoy's stream idle timeout does
	// (default 30s).
	PauseTimeout time.Duration
	// ManualTicks disables the per-VM tick timers: proxy_on_tick then only
	// runs when Host.Tick is called (for tests on synthetic time).
	ManualTicks bool
	// CallFailures chooses how a failed proxy_http_call is reported
	// (default CallFailureEnvoy). See CallFailureMode.
	CallFailures CallFailureMode
	// MaxBodyBytes bounds the bodies the host buffers: request and response
	// bodies handed to body callbacks and proxy_http_call responses
	// (default 1 MiB for bodies, 16 MiB for call responses when zero).
	MaxBodyBytes int64
	// FailOpen lets requests through unfiltered once a VM has failed (trapped),
	// like Envoy's PluginConfig.fail_open; by default they get a 503.
	FailOpen bool
	// Now is the clock behind proxy_get_current_time_nanoseconds and the
	// request.time property (default time.Now). The guest's WASI clocks are
	// always the real ones.
	Now func() time.Time
}

// Host loads one proxy-wasm module and runs one VM (module instance) per
// worker, with the proxy-wasm ABI 0.2.1 host functions, shared data, metrics,
// ticks and HTTP calls shared between them. It is safe for concurrent use.
type Host struct {
	cfg      Config                // resolved configuration
	logger   *slog.Logger          // never nil
	level    LogLevel              // minimum guest log level
	runtime  wazero.Runtime        // owns compiled code and instances
	compiled wazero.CompiledModule // the module, compiled once
	cache    wazero.CompilationCache
	vms      []*VM         // one per worker
	next     atomic.Uint64 // round-robin cursor
	shared   *sharedData
	queues   *sharedQueues
	metrics  *metricRegistry
	calls    *caller            // proxy_http_call dispatcher
	ctx      context.Context    // cancelled by Close
	cancel   context.CancelFunc // cancels ctx
	trackMu  sync.Mutex         // guards stopping and wg.Add
	stopping bool               // no more background goroutines
	wg       sync.WaitGroup     // tick loops, in-flight calls, queue notifications
	closed   atomic.Bool
}

// defaults for Config.
const (
	defaultWorkers      = 2
	defaultPluginName   = "sluice"
	defaultPauseTimeout = 30 * time.Second
	defaultMaxBody      = 1 << 20
	defaultMaxCallBody  = 16 << 20
)

// resolve validates cfg and fills in defaults; errors name the field.
func (cfg Config) resolve() (Config, LogLevel, error) {
	if cfg.Wasm == nil && cfg.WasmPath == "" {
		return cfg, 0, errors.New("host config: Wasm or WasmPath is required")
	}
	if cfg.Workers < 0 {
		return cfg, 0, fmt.Errorf("host config: Workers: %d, must be at least 1 (0 means %d)", cfg.Workers, defaultWorkers)
	}
	if cfg.Workers == 0 {
		cfg.Workers = defaultWorkers
	}
	if cfg.PluginName == "" {
		cfg.PluginName = defaultPluginName
	}
	level := LogInfo
	if cfg.LogLevel != "" {
		l, err := ParseLogLevel(cfg.LogLevel)
		if err != nil {
			return cfg, 0, fmt.Errorf("host config: LogLevel: %w", err)
		}
		level = l
	}
	if cfg.PauseTimeout < 0 {
		return cfg, 0, fmt.Errorf("host config: PauseTimeout: %v, must not be negative", cfg.PauseTimeout)
	}
	if cfg.PauseTimeout == 0 {
		cfg.PauseTimeout = defaultPauseTimeout
	}
	if cfg.MaxBodyBytes < 0 {
		return cfg, 0, fmt.Errorf("host config: MaxBodyBytes: %d, must not be negative", cfg.MaxBodyBytes)
	}
	if cfg.CallFailures != CallFailureEnvoy && cfg.CallFailures != CallFailureEmpty {
		return cfg, 0, fmt.Errorf("host config: CallFailures: unknown mode %d", cfg.CallFailures)
	}
	for name, addr := range cfg.Clusters {
		if name == "" {
			return cfg, 0, errors.New("host config: Clusters: empty cluster name")
		}
		if _, port, err := net.SplitHostPort(addr); err != nil || port == "" {
			return cfg, 0, fmt.Errorf("host config: Clusters[%q]: address %q is not host:port", name, addr)
		}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return cfg, level, nil
}

// New loads the module, checks that it speaks proxy-wasm ABI 0.2.x and that
// this host provides every function it imports, then starts cfg.Workers VMs
// the way Envoy does: _initialize (and main, if exported), then
// proxy_on_context_create for the root context, proxy_on_vm_start and
// proxy_on_configure. A VM that refuses its configuration fails New with an
// error that quotes what the guest logged while configuring.
func New(ctx context.Context, cfg Config) (*Host, error) {
	cfg, level, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	bin := cfg.Wasm
	if bin == nil {
		bin, err = os.ReadFile(cfg.WasmPath)
		if err != nil {
			return nil, fmt.Errorf("host config: WasmPath: %w", err)
		}
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	h := &Host{
		cfg:     cfg,
		logger:  logger,
		level:   level,
		shared:  newSharedData(),
		queues:  newSharedQueues(),
		metrics: newMetricRegistry(),
	}
	h.ctx, h.cancel = context.WithCancel(context.Background())
	maxCall := cfg.MaxBodyBytes
	if maxCall == 0 {
		maxCall = defaultMaxCallBody
	}
	h.calls = newCaller(cfg.Clusters, maxCall, cfg.CallFailures)

	rc := wazero.NewRuntimeConfigCompiler()
	if cfg.CompilationCacheDir != "" {
		h.cache, err = wazero.NewCompilationCacheWithDir(cfg.CompilationCacheDir)
		if err != nil {
			return nil, fmt.Errorf("host config: CompilationCacheDir: %w", err)
		}
		rc = rc.WithCompilationCache(h.cache)
	}
	h.runtime = wazero.NewRuntimeWithConfig(ctx, rc)
	if err := h.load(ctx, bin); err != nil {
		h.shutdownRuntime(ctx)
		return nil, err
	}
	for i := 0; i < cfg.Workers; i++ {
		vm := newVM(h, i)
		h.vms = append(h.vms, vm)
		if err := vm.start(ctx); err != nil {
			_ = h.Close(ctx)
			return nil, fmt.Errorf("host: VM %d: %w", i, err)
		}
	}
	if !cfg.ManualTicks {
		for _, vm := range h.vms {
			h.goTracked(vm.tickLoop)
		}
	}
	return h, nil
}

// goTracked runs f in a goroutine that Close waits for; it returns false
// once Close has begun.
func (h *Host) goTracked(f func()) bool {
	h.trackMu.Lock()
	defer h.trackMu.Unlock()
	if h.stopping {
		return false
	}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		f()
	}()
	return true
}

// load instantiates WASI and the env host module, compiles the guest and
// checks its ABI version, imports and exports.
func (h *Host) load(ctx context.Context, bin []byte) error {
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, h.runtime); err != nil {
		return fmt.Errorf("host: instantiating WASI: %w", err)
	}
	if err := h.instantiateEnv(ctx); err != nil {
		return fmt.Errorf("host: instantiating env: %w", err)
	}
	compiled, err := h.runtime.CompileModule(ctx, bin)
	if err != nil {
		return fmt.Errorf("host: compiling the module: %w", err)
	}
	h.compiled = compiled
	exports := compiled.ExportedFunctions()
	if _, ok := exports["proxy_abi_version_0_2_1"]; !ok {
		if _, ok := exports["proxy_abi_version_0_2_0"]; !ok {
			found := "none"
			for name := range exports {
				if strings.HasPrefix(name, "proxy_abi_version_") {
					found = name
				}
			}
			return fmt.Errorf("host: the module does not export proxy_abi_version_0_2_1 (nor 0_2_0): this host speaks proxy-wasm ABI 0.2.x, the module advertises %s", found)
		}
	}
	if err := checkImports(compiled.ImportedFunctions()); err != nil {
		return err
	}
	h.warnEnvoyLinking(compiled.ImportedFunctions(), exports)
	if err := checkExports(exports); err != nil {
		return err
	}
	if _, ok := compiled.ExportedMemories()["memory"]; !ok {
		return errors.New("host: the module does not export its memory as \"memory\"")
	}
	return nil
}

// checkImports fails on any import this host does not provide, naming it.
func checkImports(defs []api.FunctionDefinition) error {
	var missing []string
	for _, d := range defs {
		mod, name, _ := d.Import()
		switch mod {
		case "env":
			spec, ok := hostFuncs[name]
			if !ok {
				missing = append(missing, mod+"."+name)
				continue
			}
			if !sameTypes(d.ParamTypes(), spec.params) || !sameTypes(d.ResultTypes(), []api.ValueType{api.ValueTypeI32}) {
				return fmt.Errorf("host: the module imports env.%s with signature %s, the ABI defines %s",
					name, signature(d.ParamTypes(), d.ResultTypes()), signature(spec.params, []api.ValueType{api.ValueTypeI32}))
			}
		case wasi_snapshot_preview1.ModuleName:
			// wazero implements all of wasi_snapshot_preview1.
		default:
			missing = append(missing, mod+"."+name)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return fmt.Errorf("host: the module imports %s, which this host does not implement", strings.Join(missing, ", "))
	}
	return nil
}

// abi01Only are the host functions proxy-wasm-cpp-host registers only for
// ABI 0.1.0 modules; abi021Only, only for ABI 0.2.1 modules.
var (
	abi01Only  = []string{"proxy_continue_request", "proxy_continue_response", "proxy_clear_route_cache", "proxy_get_configuration"}
	abi021Only = []string{"proxy_get_log_level"}
)

// warnEnvoyLinking warns about imports this host provides but Envoy would
// not link for the module's ABI version: the module would load here and fail
// in Envoy with "missing import".
func (h *Host) warnEnvoyLinking(defs []api.FunctionDefinition, exports map[string]api.FunctionDefinition) {
	_, v021 := exports["proxy_abi_version_0_2_1"]
	for _, d := range defs {
		mod, name, _ := d.Import()
		if mod != "env" {
			continue
		}
		for _, n := range abi01Only {
			if name == n {
				h.logger.Warn("the module imports an ABI 0.1.0 host function that Envoy does not provide to ABI 0.2.x modules; it would fail to load in Envoy", "import", "env."+name)
			}
		}
		for _, n := range abi021Only {
			if name == n && !v021 {
				h.logger.Warn("the module imports an ABI 0.2.1 host function but advertises ABI 0.2.0; Envoy would not link it", "import", "env."+name)
			}
		}
	}
}

// checkExports fails on a callback exported with the wrong signature, and on
// a module with neither proxy_on_memory_allocate nor malloc.
func checkExports(exports map[string]api.FunctionDefinition) error {
	_, alloc := exports["proxy_on_memory_allocate"]
	_, malloc := exports["malloc"]
	if !alloc && !malloc {
		return errors.New("host: the module exports neither proxy_on_memory_allocate nor malloc: the host cannot hand it data")
	}
	for name, want := range callbackSigs {
		d, ok := exports[name]
		if !ok {
			continue
		}
		if !sameTypes(d.ParamTypes(), want.params) || !sameTypes(d.ResultTypes(), want.results) {
			return fmt.Errorf("host: the module exports %s with signature %s, the ABI defines %s",
				name, signature(d.ParamTypes(), d.ResultTypes()), signature(want.params, want.results))
		}
	}
	return nil
}

// sameTypes compares two value type lists.
func sameTypes(a, b []api.ValueType) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// signature formats a function type like "(i32, i32) -> i32".
func signature(params, results []api.ValueType) string {
	names := func(ts []api.ValueType) string {
		s := make([]string, len(ts))
		for i, t := range ts {
			s[i] = api.ValueTypeName(t)
		}
		return strings.Join(s, ", ")
	}
	return "(" + names(params) + ") -> (" + names(results) + ")"
}

// Workers returns the number of VMs.
func (h *Host) Workers() int { return len(h.vms) }

// VM returns worker i's VM.
func (h *Host) VM(i int) *VM { return h.vms[i] }

// Pick returns the next VM in round-robin order: how the Proxy assigns each
// request to a worker.
func (h *Host) Pick() *VM {
	n := h.next.Add(1) - 1
	return h.vms[n%uint64(len(h.vms))]
}

// Tick calls proxy_on_tick on every VM whose root context set a tick period,
// now, whatever the period. Tests drive ticks with it (see Config.ManualTicks).
func (h *Host) Tick() {
	for _, vm := range h.vms {
		vm.Tick()
	}
}

// Metrics returns every metric the guests defined, sorted by name.
func (h *Host) Metrics() []Metric { return h.metrics.snapshot() }

// Metric returns the metric of that name (the first type found, counters
// before gauges before histograms).
func (h *Host) Metric(name string) (Metric, bool) {
	for _, m := range h.metrics.snapshot() {
		if m.Name == name {
			return m, true
		}
	}
	return Metric{}, false
}

// MetricsHandler serves the guests' metrics in the Prometheus text format.
func (h *Host) MetricsHandler() http.Handler { return metricsHandler{h.metrics} }

// SharedData returns a copy of a shared-data value and its CAS.
func (h *Host) SharedData(key string) (value []byte, cas uint32, ok bool) {
	return h.shared.get(key)
}

// SetSharedData sets a shared-data value as proxy_set_shared_data does (cas 0
// always succeeds); it returns StatusCasMismatch when cas is stale.
func (h *Host) SetSharedData(key string, value []byte, cas uint32) Status {
	return h.shared.set(key, value, cas)
}

// Close stops the tick timers, abandons in-flight HTTP calls, then shuts each
// VM down as proxy-wasm-cpp-host does: proxy_on_done on the root context
// (waiting until ctx is done for proxy_done when it returns false), then
// proxy_on_delete, then closes the instances and the runtime.
func (h *Host) Close(ctx context.Context) error {
	if h.closed.Swap(true) {
		return nil
	}
	// proxy_on_done first, while ticks and calls still run: a root context
	// that returns false finishes its work on them and calls proxy_done.
	for _, vm := range h.vms {
		vm.done(ctx)
	}
	h.trackMu.Lock()
	h.stopping = true
	h.trackMu.Unlock()
	h.cancel()
	h.wg.Wait()
	for _, vm := range h.vms {
		vm.close(ctx)
	}
	h.calls.close()
	h.shutdownRuntime(ctx)
	return nil
}

// shutdownRuntime closes the runtime and the compilation cache.
func (h *Host) shutdownRuntime(ctx context.Context) {
	if h.runtime != nil {
		_ = h.runtime.Close(ctx)
	}
	if h.cache != nil {
		_ = h.cache.Close(ctx)
	}
}

// slogLevel maps a proxy-wasm log level to slog's.
func slogLevel(l LogLevel) slog.Level {
	switch l {
	case LogTrace:
		return slog.LevelDebug - 4
	case LogDebug:
		return slog.LevelDebug
	case LogInfo:
		return slog.LevelInfo
	case LogWarn:
		return slog.LevelWarn
	case LogError:
		return slog.LevelError
	}
	return slog.LevelError + 4
}
