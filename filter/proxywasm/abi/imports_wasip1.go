//go:build wasip1

package abi

import "unsafe"

// The host functions of ABI 0.2.1 the filter uses. Pointers are addresses in
// the module's memory; a string parameter is passed as (pointer, length).

//go:wasmimport env proxy_log
func proxyLog(level uint32, msg string) uint32

//go:wasmimport env proxy_get_buffer_bytes
func proxyGetBufferBytes(buffer, start, maxSize uint32, retData, retSize *uint32) uint32

//go:wasmimport env proxy_set_buffer_bytes
func proxySetBufferBytes(buffer, start, length uint32, data unsafe.Pointer, size uint32) uint32

//go:wasmimport env proxy_get_header_map_value
func proxyGetHeaderMapValue(mapType uint32, key string, retData, retSize *uint32) uint32

//go:wasmimport env proxy_add_header_map_value
func proxyAddHeaderMapValue(mapType uint32, key string, value string) uint32

//go:wasmimport env proxy_get_property
func proxyGetProperty(path string, retData, retSize *uint32) uint32

//go:wasmimport env proxy_continue_stream
func proxyContinueStream(stream uint32) uint32

//go:wasmimport env proxy_send_local_response
func proxySendLocalResponse(status uint32, details string, body unsafe.Pointer, bodySize uint32,
	headers unsafe.Pointer, headersSize uint32, grpcStatus int32) uint32

//go:wasmimport env proxy_http_call
func proxyHTTPCall(upstream string, headers unsafe.Pointer, headersSize uint32, body unsafe.Pointer, bodySize uint32,
	trailers unsafe.Pointer, trailersSize uint32, timeoutMs uint32, retCallID *uint32) uint32

//go:wasmimport env proxy_set_effective_context
func proxySetEffectiveContext(id uint32) uint32

//go:wasmimport env proxy_set_tick_period_milliseconds
func proxySetTickPeriodMilliseconds(ms uint32) uint32

//go:wasmimport env proxy_define_metric
func proxyDefineMetric(metricType uint32, name string, retID *uint32) uint32

//go:wasmimport env proxy_increment_metric
func proxyIncrementMetric(id uint32, delta int64) uint32

// clockMonotonic is WASI's monotonic clock id.
const clockMonotonic = 1

// clockRealtime is WASI's wall clock id.
const clockRealtime = 0

// The filter reads the clock itself rather than through package time, whose
// dependency on package syscall adds WASI imports (fd_fdstat_set_flags,
// fd_prestat_get, ...) that proxies need not provide.
//
//go:wasmimport wasi_snapshot_preview1 clock_time_get
func clockTimeGet(clock uint32, precision uint64, out *uint64) uint32

//go:wasmimport env proxy_get_shared_data
func proxyGetSharedData(key string, retValue, retSize, retCas *uint32) uint32

//go:wasmimport env proxy_set_shared_data
func proxySetSharedData(key string, value unsafe.Pointer, valueSize uint32, cas uint32) uint32
