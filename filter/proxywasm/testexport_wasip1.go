//go:build wasip1 && sluicetest

//lint:file-ignore U1000 the go:wasmexport functions are called by the host, which staticcheck cannot see

package main

import (
	"runtime"
	"strconv"
	"strings"
	"unsafe"

	"github.com/sluicehq/sluice/filter/proxywasm/abi"
)

// The exports of this file exist only in builds with the sluicetest tag.

// memStats is global so that reading it allocates nothing itself.
var memStats runtime.MemStats

// sluiceTestMallocs exports the guest's allocation count for the tests'
// allocation check.
//
//go:wasmexport sluice_test_mallocs
func sluiceTestMallocs() uint64 {
	runtime.ReadMemStats(&memStats)
	return memStats.Mallocs
}

// sluiceTestGC runs a garbage collection, so that a test counting host
// calls over a short window does not count the runtime's own clock reads
// of a collection that happens to start in it.
//
//go:wasmexport sluice_test_gc
func sluiceTestGC() { runtime.GC() }

var spinBuf [64]byte

//go:wasmexport sluice_test_spin
func sluiceTestSpin(n uint32) uint32 {
	var total uint32
	for i := uint32(0); i < n; i++ {
		b := strconv.AppendInt(spinBuf[:0], int64(i)*7919, 10)
		total += uint32(len(b))
	}
	return total
}

// The proxy of the sluicetest build: the real one, whose calls on a
// precheck rejection's path can be answered inside the guest instead
// (sluiceTestStubHost), so that a benchmark measures the guest's own work.
var (
	testRoot   = &stubRoot{Host: abi.NewHost()}
	testStream = &stubStream{}
)

// The proxy of the sluicetest build: the stubs around package abi's
// bindings.
type (
	rootAPI   = *stubRoot
	streamAPI = *stubStream
	callAPI   = abi.CallResponse
)

var (
	_ rootProxy   = (*stubRoot)(nil)
	_ streamProxy = (*stubStream)(nil)
	_ callProxy   = abi.CallResponse{}
)

// newProxy returns the proxy the filter talks to.
func newProxy() proxy {
	return proxy{root: testRoot, stream: testStream, calls: abi.CallResponse{}}
}

// stub is what the stubs share: whether they are on, and what they
// answer.
var stub struct {
	panics bool   // RemoteAddress panics (sluiceTestPanic)
	on     bool   // answer in the guest
	addr   string // the peer address, as the host last gave it
	now    int64  // the time when stubbing began
	locals uint32 // local replies swallowed
}

// stubRoot is an abi.Host whose clock and counters, when stubbing, never
// reach the host.
type stubRoot struct{ *abi.Host }

// stubStream is an abi.Stream whose peer address and local replies, when
// stubbing, never reach the host.
type stubStream struct{ abi.Stream }

// TrapValue is the request header value on which the sluicetest build
// reads memory past the end of its linear memory: a Wasm trap, which no Go
// recover sees, so the host fails the VM (e2e/abi's reload test). (os.Exit
// would not do: Envoy's proc_exit returns.)
const TrapValue = "sluice-test-trap"

// trapSink keeps the trapping load from being optimized away.
var trapSink byte

func (h *stubStream) RequestHeader(name string) (string, bool) {
	v, ok := h.Stream.RequestHeader(name)
	if ok && v == TrapValue {
		trapSink = *(*byte)(unsafe.Add(nil, uintptr(0xfffffff0)))
	}
	return v, ok
}

func (h *stubStream) RemoteAddress() (string, bool) {
	if stub.panics {
		panic("injected failure")
	}
	if stub.on {
		return stub.addr, true
	}
	return h.Stream.RemoteAddress()
}

func (h *stubRoot) Now() int64 {
	if stub.on {
		return stub.now
	}
	return h.Host.Now()
}

func (h *stubRoot) IncrementCounter(id uint32, delta int64) {
	if !stub.on {
		h.Host.IncrementCounter(id, delta)
	}
}

func (h *stubStream) SendLocalResponse(status uint32, details string, body, headers []byte) abi.Status {
	if stub.on {
		stub.locals++
		return abi.StatusOK
	}
	return h.Stream.SendLocalResponse(status, details, body, headers)
}

// sluiceTestStubHost turns the stubs on (on != 0: the peer address and the
// time are read from the host once, now) or off, and returns the number of
// local replies swallowed since they were last turned on.
//
//go:wasmexport sluice_test_stub_host
func sluiceTestStubHost(on uint32) uint32 {
	stub.on = false
	if on == 0 {
		return stub.locals
	}
	addr, _ := testStream.Stream.RemoteAddress()
	stub.addr, stub.now, stub.locals = strings.Clone(addr), testRoot.Host.Now(), 0
	stub.on = true
	return 0
}

// sluiceTestPanic makes reading the peer address panic (on != 0), as a bug
// in a callback would, or stops it.
//
//go:wasmexport sluice_test_panic
func sluiceTestPanic(on uint32) { stub.panics = on != 0 }
