//go:build wasip1

package abi

import (
	"unsafe"

	"github.com/sluicehq/sluice/filter/core/headermap"
)

// Out-parameters of host calls: globals, so that the host writes into memory
// the Go compiler knows is live (never a stack slot).
var (
	outData uint32
	outSize uint32
	outID   uint32
)

// view returns the size bytes at address ptr (memory this module handed out
// through proxy_on_memory_allocate) as a string, without copying.
func view(ptr, size uint32) string {
	if size == 0 || ptr == 0 {
		return ""
	}
	return unsafe.String((*byte)(unsafe.Add(nil, uintptr(ptr))), size)
}

// viewBytes is view as a byte slice.
func viewBytes(ptr, size uint32) []byte {
	if size == 0 || ptr == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Add(nil, uintptr(ptr))), size)
}

// data returns the address and length of b for a host call.
func data(b []byte) (unsafe.Pointer, uint32) {
	return unsafe.Pointer(unsafe.SliceData(b)), uint32(len(b))
}

// Host calls the host functions that do not act on a stream: the clock,
// logs, the configuration, calls, the tick, metrics and shared data.
// Strings and byte slices it returns point into host-filled memory and are
// valid only until the current callback returns.
type Host struct {
	trailers []byte // the (empty) trailers of HTTP calls
}

// Stream calls the host functions that act on the current stream (the
// effective context). Strings and byte slices it returns point into
// host-filled memory and are valid only until the current callback
// returns.
type Stream struct{}

// Body returns at most size bytes from start of the current stream's
// request body (request) or response body, during the body callbacks.
// What it returns is valid until the next Body of the callback: each read
// reuses the scratch memory of the one before, so that a body read in
// slices needs no more than one slice of it.
func (Stream) Body(request bool, start, size int) ([]byte, error) {
	scratch.rewindBody()
	if request {
		return buffer(BufferRequestBody, start, size)
	}
	return buffer(BufferResponseBody, start, size)
}

// SetResponseBody replaces the current stream's response body chunk (of
// size bytes) with data, during proxy_on_response_body. Envoy replaces the
// whole chunk when start is 0 and length at least its size (and prepends
// when both are 0: the chunk is empty).
func (Stream) SetResponseBody(size int, data []byte) error {
	p, n := data2(data)
	return Status(proxySetBufferBytes(uint32(BufferResponseBody), 0, uint32(size), p, n)).err()
}

// data2 returns the address and length of b for a host call; a valid
// address when b is empty.
func data2(b []byte) (unsafe.Pointer, uint32) {
	if len(b) == 0 {
		return unsafe.Pointer(&emptyData), 0
	}
	return unsafe.Pointer(unsafe.SliceData(b)), uint32(len(b))
}

// emptyData is where an empty buffer points.
var emptyData byte

// CallResponse reads the answer of a call being delivered, during
// proxy_on_http_call_response, proxy_on_grpc_receive and
// proxy_on_grpc_close. Strings and byte slices it returns are valid only
// until the current callback returns.
type CallResponse struct{}

// NewHost returns a Host.
func NewHost() *Host {
	// An empty map as a 4-byte zero count: some hosts cannot parse 0 bytes.
	return &Host{trailers: headermap.Append(nil, nil)}
}

// outTime receives clock_time_get's result.
var outTime uint64

// Now returns WASI's monotonic clock in nanoseconds (0 if the host has
// none, which stops the precheck's clock but breaks nothing).
func (h *Host) Now() int64 {
	outTime = 0
	clockTimeGet(clockMonotonic, 1, &outTime)
	return int64(outTime)
}

// WallNow returns WASI's wall clock in Unix nanoseconds (0 if the host has
// none). It reads the clock directly: time.Now would link the time zone
// loading of package time, and with it WASI imports (fd_prestat_*) that the
// oldest Envoy the README claims does not provide.
func (h *Host) WallNow() int64 {
	outTime = 0
	clockTimeGet(clockRealtime, 1, &outTime)
	return int64(outTime)
}

// Log writes a message at a proxy-wasm log level.
func (h *Host) Log(level uint32, msg string) { proxyLog(level, msg) }

// PluginConfiguration returns the plugin configuration, during
// proxy_on_configure.
func (h *Host) PluginConfiguration(size int) ([]byte, error) {
	return buffer(BufferPluginConfiguration, 0, size)
}

// Body returns the body of an HTTP call's response, during
// proxy_on_http_call_response.
func (CallResponse) Body(size int) ([]byte, error) {
	return buffer(BufferCallResponseBody, 0, size)
}

// buffer returns at most size bytes of buffer b from start.
func buffer(b BufferType, start, size int) ([]byte, error) {
	if size <= 0 {
		return nil, nil
	}
	outData, outSize = 0, 0
	if err := Status(proxyGetBufferBytes(uint32(b), uint32(start), uint32(size), &outData, &outSize)).err(); err != nil {
		return nil, err
	}
	return viewBytes(outData, outSize), nil
}

func header(m MapType, name string) (string, bool) {
	outData, outSize = 0, 0
	if Status(proxyGetHeaderMapValue(uint32(m), name, &outData, &outSize)) != StatusOK {
		return "", false
	}
	return view(outData, outSize), true
}

// RequestHeader returns a request header of the current stream.
func (Stream) RequestHeader(name string) (string, bool) { return header(MapRequestHeaders, name) }

// ResponseHeader returns a response header of the current stream.
func (Stream) ResponseHeader(name string) (string, bool) { return header(MapResponseHeaders, name) }

// ResponseTrailer returns a response trailer of the current stream.
func (Stream) ResponseTrailer(name string) (string, bool) {
	return header(MapResponseTrailers, name)
}

// Property returns a property of the current stream (path segments
// separated by NUL), as the host serializes it.
func (Stream) Property(path string) ([]byte, bool) {
	outData, outSize = 0, 0
	if Status(proxyGetProperty(path, &outData, &outSize)) != StatusOK {
		return nil, false
	}
	return viewBytes(outData, outSize), true
}

// CallResponseHeader returns a header of an HTTP call's response.
func (CallResponse) Header(name string) (string, bool) {
	return header(MapCallResponseHeaders, name)
}

// CallResponseTrailer returns a trailer of an HTTP call's response.
func (CallResponse) Trailer(name string) (string, bool) {
	return header(MapCallResponseTrailers, name)
}

// AddRequestHeader adds a header to the current stream's request.
func (Stream) AddRequestHeader(name, value string) error {
	return Status(proxyAddHeaderMapValue(uint32(MapRequestHeaders), name, value)).err()
}

// AddResponseHeader adds a header to the current stream's response.
func (Stream) AddResponseHeader(name, value string) error {
	return Status(proxyAddHeaderMapValue(uint32(MapResponseHeaders), name, value)).err()
}

// sourceAddress is the property path of the downstream peer's address:
// path segments separated by NUL.
const sourceAddress = "source\x00address"

// RemoteAddress returns the downstream peer's address ("ip:port"). It is
// kept small enough to inline into its caller (a host call is made on
// every request): the out-parameters are read only when the host says it
// wrote them, and a 0 address or size makes an empty string.
func (Stream) RemoteAddress() (string, bool) {
	if Status(proxyGetProperty(sourceAddress, &outData, &outSize)) != StatusOK {
		return "", false
	}
	return unsafe.String((*byte)(unsafe.Add(nil, uintptr(outData))), outSize), true
}

// ResumeRequest resumes the current stream's paused request.
func (Stream) ResumeRequest() error {
	return Status(proxyContinueStream(uint32(StreamRequest))).err()
}

// SendLocalResponse answers the current stream's request locally; headers
// is a serialized header map (package headermap). It returns the host's
// Status, not an error, to stay small enough to inline into its caller.
func (Stream) SendLocalResponse(status uint32, details string, body, headers []byte) Status {
	return Status(proxySendLocalResponse(status, details, unsafe.Pointer(unsafe.SliceData(body)), uint32(len(body)),
		unsafe.Pointer(unsafe.SliceData(headers)), uint32(len(headers)), -1))
}

// HTTPCall sends an HTTP request to an upstream cluster and returns the
// call's id; the response arrives in proxy_on_http_call_response. headers
// is a serialized header map (package headermap).
func (h *Host) HTTPCall(cluster string, headers, body []byte, timeoutMs uint32) (uint32, error) {
	hp, hn := data(headers)
	bp, bn := data(body)
	tp, tn := data(h.trailers)
	outID = 0
	if err := Status(proxyHTTPCall(cluster, hp, hn, bp, bn, tp, tn, timeoutMs, &outID)).err(); err != nil {
		return 0, err
	}
	return outID, nil
}

// GRPCCall sends one unary gRPC request through the proxy's gRPC client
// and returns the call's id; the answer arrives in proxy_on_grpc_receive
// (the response message) or proxy_on_grpc_close (the call failed).
// service is a serialized envoy.config.core.v3.GrpcService (which Envoy
// reads as a bare cluster name when it does not parse); message is the
// request message, unframed: the client frames it and sets the gRPC
// headers, grpc-timeout included.
func (h *Host) GRPCCall(service []byte, serviceName, method string, message []byte, timeoutMs uint32) (uint32, error) {
	sp, sn := data(service)
	mp, mn := data(message)
	ep, en := data(h.trailers) // no initial metadata: an empty map
	outID = 0
	if err := Status(proxyGRPCCall(sp, sn, serviceName, method, ep, en, mp, mn, timeoutMs, &outID)).err(); err != nil {
		return 0, err
	}
	return outID, nil
}

// GRPCMessage returns the response message of a gRPC call, during
// proxy_on_grpc_receive.
func (CallResponse) GRPCMessage(size int) ([]byte, error) {
	return buffer(BufferGRPCCallMessage, 0, size)
}

// outCode receives proxy_get_status's code.
var outCode uint32

// GRPCStatus returns the status of a gRPC call that failed, during
// proxy_on_grpc_close: its code and its message.
func (CallResponse) GRPCStatus() (code uint32, message string) {
	outCode, outData, outSize = 0, 0, 0
	if Status(proxyGetStatus(&outCode, &outData, &outSize)) != StatusOK {
		return 0, ""
	}
	return outCode, view(outData, outSize)
}

// SetEffectiveContext makes id the context later host calls act on.
func (Stream) SetEffectiveContext(id uint32) error {
	return Status(proxySetEffectiveContext(id)).err()
}

// SetTickPeriod asks for proxy_on_tick every ms milliseconds (0 stops it).
func (h *Host) SetTickPeriod(ms uint32) error {
	return Status(proxySetTickPeriodMilliseconds(ms)).err()
}

// DefineCounter defines a counter metric and returns its id.
func (h *Host) DefineCounter(name string) (uint32, error) {
	outID = 0
	if err := Status(proxyDefineMetric(MetricCounter, name, &outID)).err(); err != nil {
		return 0, err
	}
	return outID, nil
}

// DefineGauge defines a gauge metric and returns its id.
func (h *Host) DefineGauge(name string) (uint32, error) {
	outID = 0
	if err := Status(proxyDefineMetric(MetricGauge, name, &outID)).err(); err != nil {
		return 0, err
	}
	return outID, nil
}

// IncrementCounter adds delta to a counter or a gauge.
func (h *Host) IncrementCounter(id uint32, delta int64) {
	proxyIncrementMetric(id, delta)
}

// outCas receives proxy_get_shared_data's CAS number.
var outCas uint32

// SharedData returns key's value in the proxy's shared data (of this VM's
// vm_id) and its CAS number; found is false when key has none (or the host
// fails to read it).
func (h *Host) SharedData(key string) (value []byte, cas uint32, found bool) {
	outData, outSize, outCas = 0, 0, 0
	if Status(proxyGetSharedData(key, &outData, &outSize, &outCas)) != StatusOK {
		return nil, 0, false
	}
	return viewBytes(outData, outSize), outCas, true
}

// SetSharedData sets key's value if its CAS number is still cas (0: in any
// case); set is false on a CAS mismatch.
func (h *Host) SetSharedData(key string, value []byte, cas uint32) (set bool, err error) {
	vp, vn := data(value)
	switch st := Status(proxySetSharedData(key, vp, vn, cas)); st {
	case StatusOK:
		return true, nil
	case StatusCasMismatch:
		return false, nil
	default:
		return false, st
	}
}
