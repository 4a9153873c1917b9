//go:build wasip1

// Command emptyfilter is the smallest proxy-wasm HTTP filter upstream Go can
// build: every callback returns at once and every request continues. It is
// setup 2 of `make bench-envoy`, the cost of hosting an upstream-Go module in
// Envoy before the filter does anything, against which sluice's filter cost is
// judged. It shares no code with filter/, so the floor it measures is Go's and
// V8's alone.
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o empty.wasm ./bench/envoy/emptyfilter
package main

import "unsafe"

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
func proxyOnConfigure(rootID, size uint32) bool { return true }

//go:wasmexport proxy_on_context_create
func proxyOnContextCreate(id, parent uint32) {}

//go:wasmexport proxy_on_request_headers
func proxyOnRequestHeaders(id, n uint32, end bool) uint32 { return 0 }

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
