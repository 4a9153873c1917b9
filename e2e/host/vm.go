package host

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// VM is one instance of the module: Envoy's per-worker Wasm VM. A module
// instance is single-threaded, so every call into it, whatever goroutine it
// comes from (a request, an HTTP call response, a tick), holds mu.
type VM struct {
	host  *Host
	index int             // worker number
	ctx   context.Context // carries the VM to the host functions

	mu  sync.Mutex // serializes every call into the instance; guards the fields below
	mod api.Module // the instance
	mem api.Memory // its memory
	fns callbackFns

	rootID    uint32             // the root (plugin) context, 1 as in proxy-wasm-cpp-host
	nextID    uint32             // last context id handed out
	streams   map[uint32]*Stream // live stream contexts
	active    *Stream            // stream being called back, nil for the root context
	effective uint32             // proxy_set_effective_context, 0 when unset

	failed  error // set when the instance trapped; no more calls are made
	started bool  // the start-up lifecycle completed
	closed  bool  // set by close

	configuring bool     // inside proxy_on_configure: PLUGIN_CONFIGURATION readable
	captured    []string // guest log lines while starting, for the start error

	callResp  *callResponse       // inside proxy_on_http_call_response
	nextToken uint32              // last proxy_http_call token handed out
	calls     map[uint32]struct{} // tokens in flight
	status    callStatus          // proxy_get_status answer

	metricIDs metricIDs // this VM's metric ids

	tickPeriod time.Duration      // 0: no ticks
	tickCh     chan time.Duration // new periods for tickLoop

	pendingDone bool          // root context returned false from proxy_on_done
	doneCh      chan struct{} // closed by proxy_done while pendingDone

	stack      []uint64 // scratch stack for top-level calls
	allocStack []uint64 // scratch stack for proxy_on_memory_allocate
}

// callbackFns are the module's exported callbacks; nil when not exported.
type callbackFns struct {
	alloc            api.Function
	contextCreate    api.Function
	vmStart          api.Function
	configure        api.Function
	tick             api.Function
	requestHeaders   api.Function
	requestBody      api.Function
	requestTrailers  api.Function
	responseHeaders  api.Function
	responseBody     api.Function
	responseTrailers api.Function
	httpCallResponse api.Function
	queueReady       api.Function
	log              api.Function
	done             api.Function
	delete           api.Function
}

// callStatus is what proxy_get_status reports.
type callStatus struct {
	code    uint32 // a Status value
	message string // e.g. "reset"
}

// vmKey is the context key under which guest calls carry their VM.
type vmKey struct{}

// newVM prepares VM i; start instantiates it.
func newVM(h *Host, i int) *VM {
	vm := &VM{
		host:       h,
		index:      i,
		streams:    make(map[uint32]*Stream),
		calls:      make(map[uint32]struct{}),
		tickCh:     make(chan time.Duration, 1),
		stack:      make([]uint64, 8),
		allocStack: make([]uint64, 1),
	}
	vm.ctx = context.WithValue(context.Background(), vmKey{}, vm)
	return vm
}

// Index returns the worker number of the VM.
func (vm *VM) Index() int { return vm.index }

// Failed returns the trap that disabled the VM, or nil.
func (vm *VM) Failed() error {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	return vm.failed
}

// start instantiates the module and runs the start-up lifecycle.
func (vm *VM) start(ctx context.Context) error {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	h := vm.host
	mc := wazero.NewModuleConfig().
		WithName(fmt.Sprintf("vm%d", vm.index)).
		WithStartFunctions().
		WithSysWalltime().
		WithSysNanotime().
		WithRandSource(rand.Reader).
		WithStdout(&lineWriter{vm: vm, level: LogInfo}).
		WithStderr(&lineWriter{vm: vm, level: LogError})
	mod, err := h.runtime.InstantiateModule(vm.ctx, h.compiled, mc)
	if err != nil {
		return fmt.Errorf("instantiating the module: %w", err)
	}
	vm.mod, vm.mem = mod, mod.Memory()
	vm.fns = callbackFns{
		alloc:            mod.ExportedFunction("proxy_on_memory_allocate"),
		contextCreate:    mod.ExportedFunction("proxy_on_context_create"),
		vmStart:          mod.ExportedFunction("proxy_on_vm_start"),
		configure:        mod.ExportedFunction("proxy_on_configure"),
		tick:             mod.ExportedFunction("proxy_on_tick"),
		requestHeaders:   mod.ExportedFunction("proxy_on_request_headers"),
		requestBody:      mod.ExportedFunction("proxy_on_request_body"),
		requestTrailers:  mod.ExportedFunction("proxy_on_request_trailers"),
		responseHeaders:  mod.ExportedFunction("proxy_on_response_headers"),
		responseBody:     mod.ExportedFunction("proxy_on_response_body"),
		responseTrailers: mod.ExportedFunction("proxy_on_response_trailers"),
		httpCallResponse: mod.ExportedFunction("proxy_on_http_call_response"),
		queueReady:       mod.ExportedFunction("proxy_on_queue_ready"),
		log:              mod.ExportedFunction("proxy_on_log"),
		done:             mod.ExportedFunction("proxy_on_done"),
		delete:           mod.ExportedFunction("proxy_on_delete"),
	}
	if vm.fns.alloc == nil {
		vm.fns.alloc = mod.ExportedFunction("malloc")
	}

	vm.captured = []string{}
	defer func() { vm.captured = nil }()
	if init := mod.ExportedFunction("_initialize"); init != nil {
		if _, err := vm.call(init); err != nil {
			return fmt.Errorf("_initialize: %w%s", err, vm.capturedSuffix())
		}
		if main := mod.ExportedFunction("main"); main != nil {
			if _, err := vm.call(main, 0, 0); err != nil {
				return fmt.Errorf("main: %w%s", err, vm.capturedSuffix())
			}
		}
	} else if start := mod.ExportedFunction("_start"); start != nil {
		if _, err := vm.call(start); err != nil {
			return fmt.Errorf("_start: %w%s", err, vm.capturedSuffix())
		}
	}

	vm.nextID++
	vm.rootID = vm.nextID
	if vm.fns.contextCreate != nil {
		if _, err := vm.callContext(nil, vm.fns.contextCreate, uint64(vm.rootID), 0); err != nil {
			return fmt.Errorf("proxy_on_context_create(root): %w%s", err, vm.capturedSuffix())
		}
	}
	if vm.fns.vmStart != nil {
		ok, err := vm.callContext(nil, vm.fns.vmStart, uint64(vm.rootID), uint64(len(h.cfg.VMConfig)))
		if err != nil {
			return fmt.Errorf("proxy_on_vm_start: %w%s", err, vm.capturedSuffix())
		}
		if uint32(ok) == 0 {
			return fmt.Errorf("the filter refused its VM configuration (proxy_on_vm_start returned false)%s", vm.capturedSuffix())
		}
	}
	if vm.fns.configure != nil {
		vm.configuring = true
		ok, err := vm.callContext(nil, vm.fns.configure, uint64(vm.rootID), uint64(len(h.cfg.PluginConfig)))
		vm.configuring = false
		if err != nil {
			return fmt.Errorf("proxy_on_configure: %w%s", err, vm.capturedSuffix())
		}
		if uint32(ok) == 0 {
			return fmt.Errorf("the filter refused its plugin configuration (proxy_on_configure returned false)%s", vm.capturedSuffix())
		}
	}
	vm.started = true
	return nil
}

// capturedSuffix formats the guest's log lines captured while starting.
func (vm *VM) capturedSuffix() string {
	if len(vm.captured) == 0 {
		return " (the filter logged nothing)"
	}
	return "; the filter logged: " + strings.Join(vm.captured, " | ")
}

// call invokes fn with args on the instance. mu must be held. A trap marks
// the VM failed: like Envoy, the host makes no further calls into it.
func (vm *VM) call(fn api.Function, args ...uint64) (uint64, error) {
	if vm.failed != nil {
		return 0, vm.failed
	}
	if vm.closed {
		return 0, errVMClosed
	}
	stack := vm.stack
	if len(args) > len(stack) {
		stack = make([]uint64, len(args))
	}
	copy(stack, args)
	if err := fn.CallWithStack(vm.ctx, stack); err != nil {
		vm.fail(fmt.Errorf("%s: %w", fn.Definition().ExportNames()[0], err))
		return 0, vm.failed
	}
	if len(fn.Definition().ResultTypes()) == 0 {
		return 0, nil
	}
	return stack[0], nil
}

// callContext calls a callback on behalf of context st (nil: the root
// context), resetting the effective context around it as proxy-wasm-cpp-host
// does.
func (vm *VM) callContext(st *Stream, fn api.Function, args ...uint64) (uint64, error) {
	prevActive, prevEffective := vm.active, vm.effective
	vm.active, vm.effective = st, 0
	if st != nil {
		st.inCallback = true
	}
	r, err := vm.call(fn, args...)
	if st != nil {
		st.inCallback = false
	}
	vm.active, vm.effective = prevActive, prevEffective
	return r, err
}

// errVMClosed is returned for calls after shutdown.
var errVMClosed = errors.New("the VM is shut down")

// fail disables the VM after a trap and answers every paused stream.
func (vm *VM) fail(err error) {
	if vm.failed != nil {
		return
	}
	vm.failed = err
	vm.host.logger.Error("wasm VM failed; requests on this worker now get 503 (or pass unfiltered with FailOpen)",
		"vm", vm.index, "err", err)
	for _, st := range vm.streams {
		st.wake()
	}
}

// allocate reserves size bytes in the guest through proxy_on_memory_allocate
// (or malloc). It runs inside a host function, re-entering the guest.
func (vm *VM) allocate(size uint32) (uint32, bool) {
	if vm.fns.alloc == nil {
		return 0, false
	}
	vm.allocStack[0] = uint64(size)
	if err := vm.fns.alloc.CallWithStack(vm.ctx, vm.allocStack); err != nil {
		vm.host.logger.Error("proxy_on_memory_allocate failed", "vm", vm.index, "size", size, "err", err)
		return 0, false
	}
	p := uint32(vm.allocStack[0])
	return p, p != 0
}

// copyOut hands data to the guest: it allocates guest memory, copies data
// there and writes the address and size to the out-parameters. Empty data is
// written as address 0, size 0 without allocating, as proxy-wasm-cpp-host's
// copyToPointerSize does.
func (vm *VM) copyOut(data []byte, ptrPtr, sizePtr uint32) Status {
	if !vm.mem.WriteUint32Le(ptrPtr, 0) || !vm.mem.WriteUint32Le(sizePtr, 0) {
		return StatusInvalidMemoryAccess
	}
	if len(data) == 0 {
		return StatusOK
	}
	p, ok := vm.allocate(uint32(len(data)))
	if !ok || !vm.mem.Write(p, data) {
		return StatusInvalidMemoryAccess
	}
	if !vm.mem.WriteUint32Le(ptrPtr, p) || !vm.mem.WriteUint32Le(sizePtr, uint32(len(data))) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

// copyOutPairs serializes pairs straight into guest memory.
func (vm *VM) copyOutPairs(pairs Headers, ptrPtr, sizePtr uint32) Status {
	if !vm.mem.WriteUint32Le(ptrPtr, 0) || !vm.mem.WriteUint32Le(sizePtr, 0) {
		return StatusInvalidMemoryAccess
	}
	n := PairsSize(pairs)
	if n == 0 {
		return StatusOK
	}
	p, ok := vm.allocate(uint32(n))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	buf, ok := vm.mem.Read(p, uint32(n))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	encodePairsInto(buf, pairs)
	if !vm.mem.WriteUint32Le(ptrPtr, p) || !vm.mem.WriteUint32Le(sizePtr, uint32(n)) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

// read returns a view of guest memory; it is only valid until the guest runs.
func (vm *VM) read(ptr, size uint32) ([]byte, bool) {
	if size == 0 {
		return nil, true
	}
	return vm.mem.Read(ptr, size)
}

// readString copies a string out of guest memory.
func (vm *VM) readString(ptr, size uint32) (string, bool) {
	b, ok := vm.read(ptr, size)
	return string(b), ok
}

// target returns the context host functions act on: the effective context
// when set and still alive, else the context being called back. A nil stream
// means the root context.
func (vm *VM) target() *Stream {
	if vm.effective != 0 {
		if vm.effective == vm.rootID {
			return nil
		}
		if st, ok := vm.streams[vm.effective]; ok {
			return st
		}
	}
	return vm.active
}

// log emits a guest log line at level, and keeps it while the VM starts.
func (vm *VM) log(level LogLevel, msg string) {
	if vm.captured != nil && level >= LogInfo {
		vm.captured = append(vm.captured, level.String()+": "+msg)
	}
	if level < vm.host.level {
		return
	}
	vm.host.logger.Log(context.Background(), slogLevel(level), msg,
		slog.String("source", "wasm"), slog.String("plugin", vm.host.cfg.PluginName), slog.Int("vm", vm.index))
}

// lineWriter turns the guest's stdout or stderr into log lines, as Envoy does
// (stdout at info, stderr at error).
type lineWriter struct {
	vm    *VM          // owner; written only from inside guest calls
	level LogLevel     // level of every line
	buf   bytes.Buffer // partial line
}

// Write logs every complete line of p.
func (w *lineWriter) Write(p []byte) (int, error) {
	w.buf.Write(p)
	for {
		i := bytes.IndexByte(w.buf.Bytes(), '\n')
		if i < 0 {
			break
		}
		line := string(w.buf.Next(i + 1))
		w.vm.log(w.level, strings.TrimRight(line, "\r\n"))
	}
	return len(p), nil
}

// Tick calls proxy_on_tick on the root context if a tick period is set.
func (vm *VM) Tick() {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	if vm.tickPeriod == 0 || vm.fns.tick == nil || vm.failed != nil || vm.closed {
		return
	}
	_, _ = vm.callContext(nil, vm.fns.tick, uint64(vm.rootID))
}

// setTickPeriod records a new period and tells tickLoop. mu is held.
func (vm *VM) setTickPeriod(d time.Duration) {
	vm.tickPeriod = d
	select {
	case <-vm.tickCh:
	default:
	}
	vm.tickCh <- d
}

// tickLoop fires proxy_on_tick every tick period until the host closes.
func (vm *VM) tickLoop() {
	var ticker *time.Ticker
	var tc <-chan time.Time
	stop := func() {
		if ticker != nil {
			ticker.Stop()
			ticker, tc = nil, nil
		}
	}
	defer stop()
	for {
		select {
		case <-vm.host.ctx.Done():
			return
		case d := <-vm.tickCh:
			stop()
			if d > 0 {
				ticker = time.NewTicker(d)
				tc = ticker.C
			}
		case <-tc:
			vm.Tick()
		}
	}
}

// done runs proxy_on_done on the root context; when it returns false, it
// waits (until ctx is done) for the guest to call proxy_done, as
// proxy-wasm-cpp-host's pending-done root contexts do.
func (vm *VM) done(ctx context.Context) {
	vm.mu.Lock()
	if !vm.started || vm.closed || vm.failed != nil || vm.fns.done == nil {
		vm.mu.Unlock()
		return
	}
	ok, err := vm.callContext(nil, vm.fns.done, uint64(vm.rootID))
	if err != nil || uint32(ok) != 0 {
		vm.mu.Unlock()
		return
	}
	vm.pendingDone = true
	vm.doneCh = make(chan struct{})
	ch := vm.doneCh
	vm.mu.Unlock()
	select {
	case <-ch:
	case <-ctx.Done():
		vm.host.logger.Warn("root context did not call proxy_done before the shutdown deadline", "vm", vm.index)
	}
	vm.mu.Lock()
	vm.pendingDone = false
	vm.mu.Unlock()
}

// close runs proxy_on_delete on the root context and closes the instance.
func (vm *VM) close(ctx context.Context) {
	vm.mu.Lock()
	if vm.mod == nil || vm.closed {
		vm.mu.Unlock()
		return
	}
	if vm.started && vm.failed == nil && vm.fns.delete != nil {
		_, _ = vm.callContext(nil, vm.fns.delete, uint64(vm.rootID))
	}
	vm.closed = true
	for _, st := range vm.streams {
		st.wake()
	}
	mod := vm.mod
	vm.mu.Unlock()
	_ = mod.Close(ctx)
}
