// Package plugin is the filter's behaviour: for each request it builds the
// descriptors, rejects locally what the precheck knows the control plane
// would reject, and otherwise asks the control plane (RLS v3
// ShouldRateLimit over proxy_http_call or proxy_grpc_call) while the request waits, then lets
// it through with rate limit headers, answers 429, or applies the failure
// mode. It talks to the proxy through Host, so it runs natively in tests;
// in filter.wasm, abi.Host implements Host and the abi callbacks call VM.
//
// # Failure modes
//
// When the check of a request fails (the call cannot be made, times out,
// or gets an error or an unusable answer, the proxy never delivers the
// answer, or a callback panics), the request is let through (open) or
// answered locally with status_on_error (closed). Which one is the
// policy's: the control plane reports each descriptor's failure mode in
// its answers (the "failure_mode" field of the sluice dynamic metadata,
// "closed" when any limit that matched the descriptor fails closed), and
// the plugin remembers the last one per descriptor in its precheck table
// (an LRU bounded by precheck.max_entries, kept with the precheck off
// too). A failed request then fails
//
//   - closed if any of its descriptors was last reported closed;
//   - else open if any was last reported open;
//   - else as the plugin's failure_mode: a descriptor the control plane
//     has not answered for yet (or that was evicted from the table, or
//     whose answer carried no failure mode) follows the plugin's setting.
//
// The decision is made as soon as the failure is known, so within the call
// timeout. A panic while the descriptors are being built counts only those
// built so far. Each failure counts in sluice.errors and in
// sluice.failure_open or sluice.failure_closed.
//
// # Local 429s
//
// A request the precheck rejects gets the same RateLimit-Policy and
// RateLimit as a control-plane 429: the limit is named as the control plane
// named it (current_limit.name, remembered with the limit; the descriptor
// keys, as "api_key.path", when it gave no name). When the control plane
// denied the descriptor, the 429's Retry-After (and the RateLimit t) is
// counted from the arrival of that denial plus its retry-after, rounded up
// to whole seconds: a client that waits that long is not refused for
// having come back too early. The local block itself ends earlier (see
// package precheck), so that it never rejects what the control plane would
// allow. When the local bucket rejects, Retry-After is when the bucket has
// room again, which the control plane's answer may then push later.
//
// # One over-limit state per proxy
//
// Envoy runs one VM per worker thread. A denial one VM hears from the
// control plane is published to the proxy's shared data (package
// sharedblocks: a fixed number of slots, compare-and-swap writes, at most 3
// attempts, else the block stays in that VM), and a request that its VM's
// precheck lets through reads the shared block of each of its descriptors
// before calling the control plane: a block found goes into the VM's own
// table, which rejects on it exactly as on its own denials (until the
// control plane's reset less the VM's own call timeout), so the VM's later
// requests need no read. A request the precheck rejects reads nothing; one
// that calls out reads once per descriptor; a denial is published with one
// read and one write (more when another VM writes the same slot at once).
package plugin

// Host is what the plugin needs from the proxy. Strings and byte slices it
// returns are valid only until the current callback returns. Header names
// are lower case; header maps sent to the proxy are serialized (package
// headermap), so that the plugin can build them once and reuse them.
type Host interface {
	// Now returns a monotonic time in nanoseconds.
	Now() int64
	// WallNow returns the wall clock in Unix nanoseconds: a quota's
	// valid_until is wall time.
	WallNow() int64
	// Log writes a message at a proxy-wasm log level (LogDebug...).
	Log(level uint32, msg string)
	// PluginConfiguration returns the plugin configuration (in OnConfigure).
	PluginConfiguration(size int) ([]byte, error)

	// RequestHeader returns a request header of the current stream.
	RequestHeader(name string) (string, bool)
	// RemoteAddress returns the downstream peer's address ("ip:port").
	RemoteAddress() (string, bool)
	// ResponseHeader returns a response header of the current stream.
	ResponseHeader(name string) (string, bool)
	// ResponseTrailer returns a response trailer of the current stream.
	ResponseTrailer(name string) (string, bool)
	// Property returns a property of the current stream (path segments
	// separated by NUL, e.g. "metadata\x00filter_metadata\x00ns\x00key"),
	// serialized as the proxy does: a number as its 8 little-endian bytes,
	// a string as its bytes.
	Property(path string) ([]byte, bool)
	// AddRequestHeader adds a header to the current stream's request.
	AddRequestHeader(name, value string) error
	// AddResponseHeader adds a header to the current stream's response.
	AddResponseHeader(name, value string) error
	// ResumeRequest resumes the current stream's paused request.
	ResumeRequest() error
	// SendLocalResponse answers the current stream's request locally.
	SendLocalResponse(status uint32, details string, body, headers []byte) error
	// SetEffectiveContext makes id the current stream.
	SetEffectiveContext(id uint32) error

	// HTTPCall sends a request to an upstream cluster and returns the call's
	// id; the answer comes to VM.OnHTTPCallResponse.
	HTTPCall(cluster string, headers, body []byte, timeoutMs uint32) (uint32, error)
	// CallResponseHeader returns a header of the answer being delivered.
	CallResponseHeader(name string) (string, bool)
	// CallResponseTrailer returns a trailer of the answer being delivered.
	CallResponseTrailer(name string) (string, bool)
	// CallResponseBody returns the body of the answer being delivered.
	CallResponseBody(size int) ([]byte, error)

	// GRPCCall sends one unary gRPC request (the message unframed) through
	// the proxy's gRPC client to service (a serialized GrpcService) and
	// returns the call's id; the answer comes to VM.OnGRPCReceive or
	// VM.OnGRPCClose.
	GRPCCall(service []byte, serviceName, method string, message []byte, timeoutMs uint32) (uint32, error)
	// GRPCMessage returns the response message being delivered.
	GRPCMessage(size int) ([]byte, error)
	// GRPCStatus returns the status of the gRPC call being closed.
	GRPCStatus() (code uint32, message string)

	// SetTickPeriod asks for OnTick every ms milliseconds.
	SetTickPeriod(ms uint32) error
	// DefineCounter defines a counter metric.
	DefineCounter(name string) (uint32, error)
	// DefineGauge defines a gauge metric.
	DefineGauge(name string) (uint32, error)
	// IncrementCounter adds delta to a counter, or to a gauge (which may
	// go down).
	IncrementCounter(id uint32, delta int64)

	// SharedData and SetSharedData are the proxy's shared data, common to
	// the VMs of one vm_id (package sharedblocks).
	SharedData(key string) (value []byte, cas uint32, found bool)
	SetSharedData(key string, value []byte, cas uint32) (set bool, err error)
}

// The proxy-wasm log levels.
const (
	LogTrace    uint32 = 0
	LogDebug    uint32 = 1
	LogInfo     uint32 = 2
	LogWarn     uint32 = 3
	LogError    uint32 = 4
	LogCritical uint32 = 5
)

// The proxy-wasm actions a stream callback returns.
const (
	ActionContinue uint32 = 0
	ActionPause    uint32 = 1
)
