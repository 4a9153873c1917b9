package dynmod

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "dynmod.h"
*/
import "C"

import (
	"unsafe"
)

// ABIVersion is the ABI version string the module reports to Envoy from
// envoy_dynamic_module_on_program_init: the one Envoy 1.40.0 expects (found
// in its binary; a mismatch only logs a warning since Envoy 1.38).
const ABIVersion = "v0.2.0"

// HeadersStatus tells Envoy what to do after a headers hook
// (envoy_dynamic_module_type_on_http_filter_*_headers_status).
type HeadersStatus int32

// The headers statuses a filter uses.
const (
	HeadersContinue HeadersStatus = 0 // pass the headers on
	HeadersStop     HeadersStatus = 1 // hold the headers; the body may still arrive (StopIteration)
	// HeadersStopAll holds the headers and stops every later hook until the
	// filter continues, buffering the body up to the watermark
	// (StopAllIterationAndWatermark).
	HeadersStopAll HeadersStatus = 4
)

// BodyStatus tells Envoy what to do after a body hook.
type BodyStatus int32

// The body statuses.
const (
	BodyContinue      BodyStatus = 0 // pass the data on
	BodyStopBuffer    BodyStatus = 1 // hold and buffer the data (StopIterationAndBuffer)
	BodyStopWatermark BodyStatus = 2 // hold, buffering up to the watermark
	BodyStopNoBuffer  BodyStatus = 3 // hold without buffering
)

// TrailersStatus tells Envoy what to do after a trailers hook.
type TrailersStatus int32

// The trailers statuses.
const (
	TrailersContinue TrailersStatus = 0
	TrailersStop     TrailersStatus = 1
)

// HeaderKind names one of the stream's four header maps.
type HeaderKind int32

// The header maps of a stream.
const (
	RequestHeaders   HeaderKind = 0
	RequestTrailers  HeaderKind = 1
	ResponseHeaders  HeaderKind = 2
	ResponseTrailers HeaderKind = 3
)

// BodyKind names one of the stream's bodies: the chunk the current body
// hook received, or what Envoy has buffered so far.
type BodyKind int32

// The bodies of a stream.
const (
	ReceivedRequestBody  BodyKind = 0
	BufferedRequestBody  BodyKind = 1
	ReceivedResponseBody BodyKind = 2
	BufferedResponseBody BodyKind = 3
)

// Attribute is an Envoy attribute
// (https://www.envoyproxy.io/docs/envoy/latest/intro/arch_overview/advanced/attributes);
// its value is its index in envoy_dynamic_module_type_attribute_id.
type Attribute int32

// The attributes sluice's descriptors read.
const (
	AttrRequestPath   Attribute = 0  // request.path: the path with its query
	AttrRequestHost   Attribute = 2  // request.host
	AttrRequestMethod Attribute = 4  // request.method
	AttrSourceAddress Attribute = 24 // source.address: the downstream peer, address:port
	AttrSourcePort    Attribute = 25 // source.port
)

// MetadataSource names where metadata is read from.
type MetadataSource int32

// The metadata sources.
const (
	DynamicMetadata MetadataSource = 0 // the stream's dynamic metadata
	RouteMetadata   MetadataSource = 1 // the matched route's metadata
)

// LogLevel is an Envoy log level (spdlog's).
type LogLevel int32

// The log levels.
const (
	LogTrace    LogLevel = 0
	LogDebug    LogLevel = 1
	LogInfo     LogLevel = 2
	LogWarn     LogLevel = 3
	LogError    LogLevel = 4
	LogCritical LogLevel = 5
	LogOff      LogLevel = 6
)

// Header is one header name and value.
type Header struct {
	Name, Value string
}

// strBuf is a module buffer over s's bytes, read by Envoy during the call:
// Go memory without pointers, which cgo lets C read for the call's length.
func strBuf(s string) C.dm_buf {
	return C.dm_buf{ptr: (*C.char)(unsafe.Pointer(unsafe.StringData(s))), length: C.size_t(len(s))}
}

// bytesBuf is strBuf for a byte slice.
func bytesBuf(b []byte) C.dm_buf {
	return C.dm_buf{ptr: (*C.char)(unsafe.Pointer(unsafe.SliceData(b))), length: C.size_t(len(b))}
}

// view returns Envoy's buffer b as a string without copying: valid only
// while Envoy keeps b (the hook), so callers copy what they keep.
func view(b C.dm_buf) string {
	if b.ptr == nil || b.length == 0 {
		return ""
	}
	return unsafe.String((*byte)(unsafe.Pointer(b.ptr)), int(b.length))
}

// headerName and headerValue view a header Envoy owns.
func headerName(h *C.dm_header) string {
	return view(C.dm_buf{ptr: h.key, length: h.key_length})
}

func headerValue(h *C.dm_header) string {
	return view(C.dm_buf{ptr: h.value, length: h.value_length})
}

// envoyHeaders views n headers at p, an array Envoy owns.
func envoyHeaders(p *C.dm_header, n C.size_t) []C.dm_header {
	if p == nil || n == 0 {
		return nil
	}
	return unsafe.Slice(p, int(n))
}

// envoyBufs views n buffers at p, an array Envoy owns.
func envoyBufs(p *C.dm_buf, n C.size_t) []C.dm_buf {
	if p == nil || n == 0 {
		return nil
	}
	return unsafe.Slice(p, int(n))
}
