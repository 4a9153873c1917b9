// Package plugin is the filter's behaviour: for each request it builds the
// descriptors, rejects locally what the precheck knows the control plane
// would reject, and otherwise asks the control plane (RLS v3
// ShouldRateLimit over proxy_http_call) while the request waits, then lets
// it through with rate limit headers, answers 429, or applies the failure
// mode. It talks to the proxy through Host, so it runs natively in tests;
// in filter.wasm, abi.Host implements Host and the abi callbacks call VM.
package plugin

// Host is what the plugin needs from the proxy. Strings and byte slices it
// returns are valid only until the current callback returns. Header names
// are lower case; header maps sent to the proxy are serialized (package
// headermap), so that the plugin can build them once and reuse them.
type Host interface {
	// Now returns a monotonic time in nanoseconds.
	Now() int64
	// Log writes a message at a proxy-wasm log level (LogDebug...).
	Log(level uint32, msg string)
	// PluginConfiguration returns the plugin configuration (in OnConfigure).
	PluginConfiguration(size int) ([]byte, error)

	// RequestHeader returns a request header of the current stream.
	RequestHeader(name string) (string, bool)
	// RemoteAddress returns the downstream peer's address ("ip:port").
	RemoteAddress() (string, bool)
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

	// SetTickPeriod asks for OnTick every ms milliseconds.
	SetTickPeriod(ms uint32) error
	// DefineCounter defines a counter metric.
	DefineCounter(name string) (uint32, error)
	// IncrementCounter adds delta to a counter.
	IncrementCounter(id uint32, delta int64)
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
