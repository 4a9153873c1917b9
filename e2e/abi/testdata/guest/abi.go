//go:build wasip1

package main

import (
	"encoding/binary"
	"unsafe"
)

// Minimal proxy-wasm ABI 0.2.1 bindings for the test guest. Every string
// parameter is passed as a (pointer, length) pair; out-parameters point at
// package-level variables, never at stack locals.

//go:wasmimport env proxy_log
func proxyLog(level uint32, msg string) uint32

//go:wasmimport env proxy_get_log_level
func proxyGetLogLevel(level *uint32) uint32

//go:wasmimport env proxy_get_current_time_nanoseconds
func proxyGetCurrentTime(t *uint64) uint32

//go:wasmimport env proxy_set_tick_period_milliseconds
func proxySetTickPeriod(ms uint32) uint32

//go:wasmimport env proxy_get_buffer_bytes
func proxyGetBufferBytes(bt, start, max uint32, data, size *uint32) uint32

//go:wasmimport env proxy_set_buffer_bytes
func proxySetBufferBytes(bt, start, size uint32, data string) uint32

//go:wasmimport env proxy_get_header_map_value
func proxyGetHeaderMapValue(mt uint32, key string, data, size *uint32) uint32

//go:wasmimport env proxy_get_header_map_pairs
func proxyGetHeaderMapPairs(mt uint32, data, size *uint32) uint32

//go:wasmimport env proxy_add_header_map_value
func proxyAddHeaderMapValue(mt uint32, key, value string) uint32

//go:wasmimport env proxy_replace_header_map_value
func proxyReplaceHeaderMapValue(mt uint32, key, value string) uint32

//go:wasmimport env proxy_remove_header_map_value
func proxyRemoveHeaderMapValue(mt uint32, key string) uint32

//go:wasmimport env proxy_send_local_response
func proxySendLocalResponse(code uint32, details, body, headers string, grpcStatus int32) uint32

//go:wasmimport env proxy_continue_stream
func proxyContinueStream(streamType uint32) uint32

//go:wasmimport env proxy_http_call
func proxyHTTPCall(cluster, headers, body, trailers string, timeoutMs uint32, token *uint32) uint32

//go:wasmimport env proxy_get_status
func proxyGetStatus(code *uint32, data, size *uint32) uint32

//go:wasmimport env proxy_set_effective_context
func proxySetEffectiveContext(id uint32) uint32

//go:wasmimport env proxy_get_shared_data
func proxyGetSharedData(key string, data, size *uint32, cas *uint32) uint32

//go:wasmimport env proxy_set_shared_data
func proxySetSharedData(key, value string, cas uint32) uint32

//go:wasmimport env proxy_define_metric
func proxyDefineMetric(metricType uint32, name string, id *uint32) uint32

//go:wasmimport env proxy_increment_metric
func proxyIncrementMetric(id uint32, delta int64) uint32

//go:wasmimport env proxy_record_metric
func proxyRecordMetric(id uint32, value uint64) uint32

//go:wasmimport env proxy_get_metric
func proxyGetMetric(id uint32, value *uint64) uint32

//go:wasmimport env proxy_register_shared_queue
func proxyRegisterSharedQueue(name string, token *uint32) uint32

//go:wasmimport env proxy_resolve_shared_queue
func proxyResolveSharedQueue(vmID, name string, token *uint32) uint32

//go:wasmimport env proxy_enqueue_shared_queue
func proxyEnqueueSharedQueue(token uint32, value string) uint32

//go:wasmimport env proxy_dequeue_shared_queue
func proxyDequeueSharedQueue(token uint32, data, size *uint32) uint32

//go:wasmimport env proxy_done
func proxyDone() uint32

//go:wasmimport env proxy_get_property
func proxyGetProperty(path string, data, size *uint32) uint32

//go:wasmimport env proxy_call_foreign_function
func proxyCallForeignFunction(name, args string, data, size *uint32) uint32

// ABI constants used by the guest.
const (
	statusOK          = 0
	statusNotFound    = 1
	statusCasMismatch = 8

	actionContinue = 0
	actionPause    = 1

	mapRequestHeaders  = 0
	mapResponseHeaders = 2
	mapCallHeaders     = 6

	bufferRequestBody  = 0
	bufferResponseBody = 1
	bufferCallResponse = 4
	bufferVMConfig     = 6
	bufferPluginConfig = 7

	metricCounter   = 0
	metricGauge     = 1
	metricHistogram = 2

	logInfo  = 2
	logError = 4
)

// Out-parameters of host calls (globals: the guest is single-threaded).
var (
	retData, retSize, retU32 uint32
	retU64                   uint64
)

// allocations keeps memory handed to the host referenced until the guest
// takes it back, so the collector cannot reuse it in between.
var allocations = map[uint32][]byte{}

//go:wasmexport proxy_on_memory_allocate
func onMemoryAllocate(size uint32) uint32 {
	b := make([]byte, size+1)
	p := uint32(uintptr(unsafe.Pointer(&b[0])))
	allocations[p] = b
	return p
}

// take returns the bytes the host wrote at (ptr, size) and releases them.
func take(ptr, size uint32) []byte {
	if size == 0 {
		return nil
	}
	b := allocations[ptr]
	delete(allocations, ptr)
	return b[:size]
}

//go:wasmexport proxy_abi_version_0_2_1
func abiVersion() {}

// logf logs a message at level.
func logf(level uint32, msg string) { proxyLog(level, msg) }

// header reads one header of map mt.
func header(mt uint32, key string) (string, uint32) {
	if st := proxyGetHeaderMapValue(mt, key, &retData, &retSize); st != statusOK {
		return "", st
	}
	return string(take(retData, retSize)), statusOK
}

// buffer reads a whole buffer.
func buffer(bt uint32) ([]byte, uint32) {
	if st := proxyGetBufferBytes(bt, 0, 1<<30, &retData, &retSize); st != statusOK {
		return nil, st
	}
	return take(retData, retSize), statusOK
}

// property reads a property given as its path segments.
func property(parts ...string) ([]byte, uint32) {
	path := ""
	for i, p := range parts {
		if i > 0 {
			path += "\x00"
		}
		path += p
	}
	if st := proxyGetProperty(path, &retData, &retSize); st != statusOK {
		return nil, st
	}
	return take(retData, retSize), statusOK
}

// sharedGet reads a shared value and its CAS.
func sharedGet(key string) (string, uint32, uint32) {
	if st := proxyGetSharedData(key, &retData, &retSize, &retU32); st != statusOK {
		return "", 0, st
	}
	return string(take(retData, retSize)), retU32, statusOK
}

// encodePairs serializes pairs in the proxy-wasm map format.
func encodePairs(pairs [][2]string) string {
	n := 4
	for _, p := range pairs {
		n += 8 + len(p[0]) + len(p[1]) + 2
	}
	b := make([]byte, 4, n)
	binary.LittleEndian.PutUint32(b, uint32(len(pairs)))
	for _, p := range pairs {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(p[0])))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(p[1])))
	}
	for _, p := range pairs {
		b = append(b, p[0]...)
		b = append(b, 0)
		b = append(b, p[1]...)
		b = append(b, 0)
	}
	return string(b)
}
