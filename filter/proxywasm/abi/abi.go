// Package abi binds the proxy-wasm ABI 0.2.1 for upstream Go (GOOS=wasip1,
// -buildmode=c-shared): the host functions the filter uses, imported with the
// wasmimport directive, and the callbacks the host calls, exported with the
// wasmexport directive, which it forwards to a Handler.
//
// Memory rules the bindings follow:
//
//   - Memory the host fills (header values, buffers, properties) is obtained
//     from proxy_on_memory_allocate. It comes from a per-callback scratch
//     arena (larger requests from the heap, kept in a list), referenced from
//     a global until the next top-level callback begins: the Go garbage
//     collector must not reclaim it while only the host knows about it.
//     Values the bindings return point into that memory and are valid only
//     until the current callback returns; callers copy what they keep.
//   - Out-parameters are globals, never stack locals.
//
// Only the files built for wasip1 touch the host; the rest (types, the
// arena) is plain Go, tested natively. Header maps cross the ABI serialized
// by package headermap.
package abi

// Status is a proxy_status_t, the result of every host function.
type Status uint32

// The statuses of ABI 0.2.1.
const (
	StatusOK                   Status = 0
	StatusNotFound             Status = 1
	StatusBadArgument          Status = 2
	StatusSerializationFailure Status = 3
	StatusParseFailure         Status = 4
	StatusInvalidMemoryAccess  Status = 6
	StatusEmpty                Status = 7
	StatusCasMismatch          Status = 8
	StatusInternalFailure      Status = 10
	StatusUnimplemented        Status = 12
)

// Error implements error; a Status other than StatusOK is an error.
func (s Status) Error() string {
	switch s {
	case StatusOK:
		return "OK"
	case StatusNotFound:
		return "NOT_FOUND"
	case StatusBadArgument:
		return "BAD_ARGUMENT"
	case StatusSerializationFailure:
		return "SERIALIZATION_FAILURE"
	case StatusParseFailure:
		return "PARSE_FAILURE"
	case StatusInvalidMemoryAccess:
		return "INVALID_MEMORY_ACCESS"
	case StatusEmpty:
		return "EMPTY"
	case StatusCasMismatch:
		return "CAS_MISMATCH"
	case StatusInternalFailure:
		return "INTERNAL_FAILURE"
	case StatusUnimplemented:
		return "UNIMPLEMENTED"
	}
	return "UNKNOWN_STATUS"
}

// err returns nil for StatusOK and the status otherwise.
func (s Status) err() error {
	if s == StatusOK {
		return nil
	}
	return s
}

// MapType is a proxy_map_type_t.
type MapType uint32

// The header maps.
const (
	MapRequestHeaders       MapType = 0
	MapRequestTrailers      MapType = 1
	MapResponseHeaders      MapType = 2
	MapResponseTrailers     MapType = 3
	MapGRPCInitialMetadata  MapType = 4
	MapGRPCTrailingMetadata MapType = 5
	MapCallResponseHeaders  MapType = 6
	MapCallResponseTrailers MapType = 7
)

// BufferType is a proxy_buffer_type_t.
type BufferType uint32

// The buffers. The spec's text says an HTTP call's response body is read as
// HTTP_RESPONSE_BODY, but hosts (proxy-wasm-cpp-host, Envoy) and SDKs use
// HTTP_CALL_RESPONSE_BODY.
const (
	BufferRequestBody         BufferType = 0
	BufferResponseBody        BufferType = 1
	BufferDownstreamData      BufferType = 2
	BufferUpstreamData        BufferType = 3
	BufferCallResponseBody    BufferType = 4
	BufferGRPCCallMessage     BufferType = 5 // a gRPC call's response message
	BufferVMConfiguration     BufferType = 6
	BufferPluginConfiguration BufferType = 7
	BufferForeignArguments    BufferType = 8
)

// StreamType is a proxy_stream_type_t.
type StreamType uint32

// The streams.
const (
	StreamRequest    StreamType = 0
	StreamResponse   StreamType = 1
	StreamDownstream StreamType = 2
	StreamUpstream   StreamType = 3
)

// The proxy_action_t values callbacks return.
const (
	ActionContinue uint32 = 0
	ActionPause    uint32 = 1
)

// The proxy_log_level_t values.
const (
	LogTrace    uint32 = 0
	LogDebug    uint32 = 1
	LogInfo     uint32 = 2
	LogWarn     uint32 = 3
	LogError    uint32 = 4
	LogCritical uint32 = 5
)

// The proxy_metric_type_t values.
const (
	MetricCounter   uint32 = 0
	MetricGauge     uint32 = 1
	MetricHistogram uint32 = 2
)

// Handler receives the callbacks of the host. Context ids are the host's;
// a plugin (root) context has parent 0.
//
// RequestHeaders, the callback of every request, does not recover from
// panics itself: a second deferred recover in the handler would cost the
// hottest callback as much again as its frame. The callback's own guard
// recovers and passes the value to RecoverRequestHeaders, which applies the
// handler's failure handling and returns the callback's action.
type Handler interface {
	OnVMStart(rootID uint32, configSize int) bool
	OnConfigure(rootID uint32, configSize int) bool
	OnContextCreate(id, parent uint32)
	RequestHeaders(id uint32, numHeaders int, endOfStream bool) uint32
	RecoverRequestHeaders(r any) uint32
	// WantsRequestBody reports whether stream id's request body is to go
	// to OnRequestBody (else it goes on at once); it must not panic.
	// OnRequestBody is told of the request body received so far.
	WantsRequestBody(id uint32) bool
	OnRequestBody(id uint32, bodySize int, endOfStream bool) uint32
	OnResponseHeaders(id uint32, numHeaders int, endOfStream bool) uint32
	OnResponseBody(id uint32, bodySize int, endOfStream bool) uint32
	OnResponseTrailers(id uint32, numTrailers int) uint32
	OnHTTPCallResponse(rootID, callID uint32, numHeaders, bodySize, numTrailers int)
	// OnGRPCReceive delivers the response message of a unary gRPC call;
	// OnGRPCClose says that the call failed with a gRPC status.
	OnGRPCReceive(rootID, callID uint32, size int)
	OnGRPCClose(rootID, callID, status uint32)
	OnTick(rootID uint32)
	OnDone(id uint32) bool
	OnLog(id uint32)
	OnDelete(id uint32)
}
