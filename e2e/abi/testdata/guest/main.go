//go:build wasip1

// Command guest is a minimal proxy-wasm module (ABI 0.2.1) for the ABI
// tests, apart from sluice's filter. Its plugin configuration "tick_ms=N"
// sets the tick period; it counts ticks in the counter guest_ticks. A
// request for /trap panics with nothing to recover it, which traps the VM
// (sluice's filter recovers its panics). Every other request continues.
package main

import (
	"strconv"
	"strings"
	"unsafe"
)

func main() {}

//go:wasmimport env proxy_set_tick_period_milliseconds
func proxySetTickPeriod(ms uint32) uint32

//go:wasmimport env proxy_get_buffer_bytes
func proxyGetBufferBytes(bt, start, max uint32, data, size *uint32) uint32

//go:wasmimport env proxy_get_header_map_value
func proxyGetHeaderMapValue(mt uint32, key string, data, size *uint32) uint32

//go:wasmimport env proxy_define_metric
func proxyDefineMetric(metricType uint32, name string, id *uint32) uint32

//go:wasmimport env proxy_increment_metric
func proxyIncrementMetric(id uint32, delta int64) uint32

const (
	bufferPluginConfig = 7
	mapRequestHeaders  = 0
	metricCounter      = 0
)

// Out-parameters of host calls (globals: never stack locals) and the ticks
// counter's id.
var retData, retSize, ticks uint32

// allocations keeps memory handed to the host referenced until the guest
// takes it back, so the collector cannot reuse it in between.
var allocations = map[uint32][]byte{}

//go:wasmexport proxy_abi_version_0_2_1
func abiVersion() {}

//go:wasmexport proxy_on_memory_allocate
func onMemoryAllocate(size uint32) uint32 {
	b := make([]byte, size+1)
	p := uint32(uintptr(unsafe.Pointer(&b[0])))
	allocations[p] = b
	return p
}

// take returns the bytes the host wrote at (retData, retSize).
func take() string {
	b := allocations[retData]
	delete(allocations, retData)
	if retSize == 0 || b == nil {
		return ""
	}
	return string(b[:retSize])
}

//go:wasmexport proxy_on_context_create
func onContextCreate(id, parent uint32) {}

//go:wasmexport proxy_on_vm_start
func onVMStart(root, size uint32) bool { return true }

//go:wasmexport proxy_on_configure
func onConfigure(root, size uint32) bool {
	proxyDefineMetric(metricCounter, "guest_ticks", &ticks)
	if size == 0 || proxyGetBufferBytes(bufferPluginConfig, 0, size, &retData, &retSize) != 0 {
		return true
	}
	if v, ok := strings.CutPrefix(take(), "tick_ms="); ok {
		ms, err := strconv.Atoi(v)
		if err != nil {
			return false
		}
		proxySetTickPeriod(uint32(ms))
	}
	return true
}

//go:wasmexport proxy_on_tick
func onTick(root uint32) { proxyIncrementMetric(ticks, 1) }

//go:wasmexport proxy_on_request_headers
func onRequestHeaders(id, n uint32, eos bool) uint32 {
	if proxyGetHeaderMapValue(mapRequestHeaders, ":path", &retData, &retSize) == 0 && take() == "/trap" {
		var m map[string]int
		m["boom"] = 1 // a nil map write: the runtime panics and the VM traps
	}
	return 0 // continue
}

//go:wasmexport proxy_on_done
func onDone(id uint32) bool { return true }

//go:wasmexport proxy_on_delete
func onDelete(id uint32) {}
