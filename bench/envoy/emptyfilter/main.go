//go:build wasip1

//lint:file-ignore U1000 the go:wasmexport functions are called by the host, which staticcheck cannot see

// Command emptyfilter is the smallest proxy-wasm HTTP filter upstream Go can
// build: every callback returns at once and every request continues. It is
// setup 2 of `make bench-envoy`, the cost of hosting an upstream-Go module in
// Envoy before the filter does anything, against which sluice's filter cost is
// judged. It shares no code with filter/, so the floor it measures is Go's and
// V8's alone.
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o empty.wasm ./bench/envoy/emptyfilter
package main

import (
	"bytes"
	"encoding/binary"
	"unsafe"
)

// pinned keeps the buffers the host asked for referenced until the next
// request for one: the host writes into them after proxy_on_memory_allocate
// returns (see DESIGN.md: memory without a Go reference can be collected).
var pinned [][]byte

//go:wasmexport proxy_abi_version_0_2_1
func proxyABIVersion() {}

//go:wasmexport proxy_on_memory_allocate
func proxyOnMemoryAllocate(size uint32) uint32 {
	if len(pinned) > 64 {
		pinned = pinned[:0]
	}
	b := make([]byte, size+1)
	pinned = append(pinned, b)
	return uint32(uintptr(unsafe.Pointer(&b[0])))
}

//go:wasmexport proxy_on_vm_start
func proxyOnVMStart(rootID, size uint32) bool { return true }

//go:wasmexport proxy_on_configure
func proxyOnConfigure(rootID, size uint32) bool {
	var data, n uint32
	if size == 0 || proxyGetBufferBytes(bufferPluginConfiguration, 0, size, &data, &n) != 0 {
		return true
	}
	conf := unsafe.Slice((*byte)(unsafe.Add(nil, uintptr(data))), n)
	configureCallout(conf)
	reply = bytes.Contains(conf, []byte(`"reply":true`))
	if reply {
		proxyDefineMetric(0, "floor.rejected", &counter)
		replyHeaders = appendPairs(nil, [][2]string{
			{"ratelimit-policy", `"user";q=1;w=3600`},
			{"ratelimit", `"user";r=0;t=3599`},
			{"retry-after", "3599"},
			{"content-type", "text/plain"},
		})
	}
	return true
}

// The floor mode's state, set by proxy_on_configure.
var (
	reply        bool
	counter      uint32
	replyHeaders []byte
	replyBody    = []byte("rate limited\n")
)

// bufferPluginConfiguration is proxy-wasm's buffer type of the plugin
// configuration.
const bufferPluginConfiguration = 7

// appendPairs serializes a header map the way proxy-wasm hosts read it.
func appendPairs(dst []byte, pairs [][2]string) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(pairs)))
	for _, p := range pairs {
		dst = binary.LittleEndian.AppendUint32(dst, uint32(len(p[0])))
		dst = binary.LittleEndian.AppendUint32(dst, uint32(len(p[1])))
	}
	for _, p := range pairs {
		dst = append(append(append(append(dst, p[0]...), 0), p[1]...), 0)
	}
	return dst
}

// rejectRequest makes a precheck rejection's host calls.
func rejectRequest() uint32 {
	var now uint64
	var d, sz uint32
	proxyGetHeaderMapValue(0, "x-user", &d, &sz)
	clockTimeGet(1, 1, &now)
	proxyIncrementMetric(counter, 1)
	proxySendLocalResponse(429, "sluice_precheck_over_limit", unsafe.Pointer(&replyBody[0]), uint32(len(replyBody)),
		unsafe.Pointer(&replyHeaders[0]), uint32(len(replyHeaders)), -1)
	return 1
}

//go:wasmimport env proxy_get_buffer_bytes
func proxyGetBufferBytes(buffer, start, maxSize uint32, retData, retSize *uint32) uint32

//go:wasmimport env proxy_get_header_map_value
func proxyGetHeaderMapValue(mapType uint32, key string, retData, retSize *uint32) uint32

//go:wasmimport env proxy_send_local_response
func proxySendLocalResponse(status uint32, details string, body unsafe.Pointer, bodySize uint32,
	headers unsafe.Pointer, headersSize uint32, grpcStatus int32) uint32

//go:wasmimport env proxy_define_metric
func proxyDefineMetric(metricType uint32, name string, retID *uint32) uint32

//go:wasmimport env proxy_increment_metric
func proxyIncrementMetric(id uint32, delta int64) uint32

//go:wasmimport wasi_snapshot_preview1 clock_time_get
func clockTimeGet(clock uint32, precision uint64, out *uint64) uint32

//go:wasmexport proxy_on_context_create
func proxyOnContextCreate(id, parent uint32) {}

//go:wasmexport proxy_on_request_headers
func proxyOnRequestHeaders(id, n uint32, end bool) uint32 {
	if reply {
		return rejectRequest()
	}
	if callout != 0 {
		return callOut(id)
	}
	return 0
}

//go:wasmexport proxy_on_response_headers
func proxyOnResponseHeaders(id, n uint32, end bool) uint32 { return 0 }

//go:wasmexport proxy_on_done
func proxyOnDone(id uint32) bool { return true }

//go:wasmexport proxy_on_log
func proxyOnLog(id uint32) {}

//go:wasmexport proxy_on_delete
func proxyOnDelete(id uint32) {}

// main is not called in c-shared mode.
func main() {}
