package core

import (
	"github.com/sluicehq/sluice/filter/core/descriptors"
	"github.com/sluicehq/sluice/filter/core/lease"
	"github.com/sluicehq/sluice/filter/core/precheck"
)

// Host is what a Worker needs from the proxy it runs in. Two hosts
// implement it: the proxy-wasm host of filter.wasm (package
// filter/proxywasm: one Wasm VM per Envoy worker thread) and the native
// host of the Envoy dynamic module (filter/native: one Go runtime for the
// whole Envoy, one Worker per configuration and worker thread).
//
// A Worker is single-threaded: the host calls it, and it calls the host,
// from one thread at a time (a proxy-wasm VM; a native worker thread, or a
// goroutine holding that Worker's lock). Strings and byte slices a host
// returns need only stay valid until the hook that asked returns; the
// core copies what it keeps.
type Host interface {
	// Now returns the proxy's monotonic clock in nanoseconds. Every worker
	// of one proxy reads the same clock: the per-Envoy state (lease pools,
	// over-limit blocks) holds times on it.
	Now() int64
	// WallNow returns the wall clock in Unix nanoseconds: a quota's
	// valid_until is wall time.
	WallNow() int64
	// Log writes a message at a level.
	Log(level Level, msg string)

	// DefineMetric defines a metric and returns its id. The core defines
	// every metric it uses in Worker.Configure (a native host can define
	// stats only while a configuration is being created; Metrics lists
	// them all).
	DefineMetric(kind MetricKind, name string) (uint32, error)
	// IncrementMetric adds delta to a counter, or to a gauge (which may go
	// down).
	IncrementMetric(id uint32, delta int64)

	// Call sends c to the control plane and returns the call's id. The
	// answer, whichever way it ends (a response, a failure, the timeout),
	// comes to Worker.Answer with that id, in the form of an
	// rlsproto.Answer, and never from inside Call. from is the stream that
	// waits for the answer, nil for a call no stream waits on (a lease
	// renewal, a settlement). Ids are unique among the calls of a Worker
	// under way.
	Call(from Stream, c *Call) (uint32, error)

	// Schedule asks for Worker.Tick in delay nanoseconds (at least a
	// millisecond), replacing any earlier request. A host may tick earlier
	// or more often (the core then finds nothing due and schedules again),
	// but not much later; with nothing scheduled, it still ticks about once
	// a second.
	Schedule(delay int64)

	// Blocks returns the over-limit blocks that the workers of the proxy
	// share for domain (called only with the precheck and shared_state on).
	Blocks(domain string) Blocks
	// Pools returns the lease pools the workers of the proxy share for
	// domain; perWorker (shared_state: false) asks for pools of this worker
	// alone, as if it were alone in its proxy.
	Pools(domain string, perWorker bool) lease.Pools
}

// Stream is one HTTP stream (a request and its response), as a host shows
// it to the core: the core reads and acts on a stream only through it. A
// host calls the core's hooks for a stream (Worker.RequestHeaders, ...)
// with the Stream current, and the core may act on it later too, from
// Worker.Answer or Worker.Tick (a resume, a local reply, a header added):
// a host then makes the stream current (proxy-wasm: its effective context)
// or hops to the stream's thread itself. After Worker.Close the core never
// calls it again.
//
// Header names are lower case. A method that acts on a stream the proxy
// already ended returns an error; the core then leaves the stream alone.
type Stream interface {
	// RequestHeader and RemoteAddress are what the descriptors read
	// (descriptors.Request).
	descriptors.Request
	// ResponseHeader returns a response header.
	ResponseHeader(name string) (string, bool)
	// ResponseTrailer returns a response trailer.
	ResponseTrailer(name string) (string, bool)
	// DynamicMetadata returns the value of key in namespace of the stream's
	// dynamic metadata, serialized as proxy-wasm serializes a property: a
	// number as its 8 little-endian IEEE 754 bytes, a string as its bytes.
	DynamicMetadata(namespace, key string) ([]byte, bool)
	// RequestEnded reports whether the request ended with its headers (no
	// body follows), during Worker.RequestHeaders. The core asks only when
	// a rate limit sizes its reserve from the request body.
	RequestEnded() bool
	// RequestBody returns at most max bytes from start of the request body
	// received so far (while the core pauses the request, the chunks add
	// up), during Worker.RequestBody. ResponseBody does the same for the
	// response body chunk being delivered, during Worker.ResponseBody. The
	// core reads at most 16 KiB at a time; what they return is valid until
	// the next read or the hook's end.
	RequestBody(start, max int) ([]byte, error)
	ResponseBody(start, max int) ([]byte, error)
	// SetResponseBody replaces the response body chunk being delivered
	// with data, during Worker.ResponseBody: a stream that may be cut holds
	// back the bytes of an unfinished event, and ends with the cut event.
	SetResponseBody(data []byte) error
	// EndResponse ends the response after the chunk being delivered,
	// during Worker.ResponseBody: the client gets the end of the stream,
	// and the rest of the upstream's answer is dropped (the upstream
	// stream reset). false: the host cannot end a response early (a
	// proxy-wasm host); the core then empties each later chunk, and the
	// stream ends when the upstream's does.
	EndResponse() bool

	// AddRequestHeader adds a header to the request (before it goes on).
	AddRequestHeader(name, value string) error
	// AddResponseHeader adds a header to the response (during
	// Worker.ResponseHeaders).
	AddResponseHeader(name, value string) error
	// Resume lets the paused request go on.
	Resume() error
	// SendLocalReply answers the request locally; headers is a header map
	// serialized by package headermap (built once and reused by the core).
	SendLocalReply(status uint32, details string, body, headers []byte) error
}

// Call is a call to the control plane: an RLS ShouldRateLimit request,
// framed for gRPC. A host sends it over HTTP/2 (Frame as the body,
// Headers as the request headers) or, when GRPCService is set and it has
// a gRPC client (proxy-wasm's proxy_grpc_call), as a unary gRPC call of
// Frame's message. Its slices are valid until Call returns.
type Call struct {
	Cluster string // the control plane's cluster
	// Headers are the request headers of the call over HTTP (:method,
	// :path, :authority, content-type, te, grpc-timeout, and any the
	// contract adds), serialized by package headermap.
	Headers []byte
	// Frame is the RateLimitRequest in gRPC's framing (a 5-byte prefix,
	// then the message).
	Frame []byte
	// GRPCService is, for transport "grpc", the serialized GrpcService of
	// the control plane (rlsproto.AppendGRPCService); nil for a call that
	// must go over HTTP (transport "http", or a call carrying a header
	// the gRPC client cannot send).
	GRPCService []byte
	// TimeoutMs is the call's timeout in milliseconds.
	TimeoutMs uint32
}

// Blocks is the over-limit blocks that the workers of one proxy share for
// one domain: a denial one worker hears from the control plane, kept so
// that every worker rejects the descriptor locally until the global limiter
// would pass it again (precheck.Block). A host implements it on its
// per-Envoy state; a block lost (overwritten, a write that loses every
// race) only makes a worker ask the control plane, never reject more.
type Blocks interface {
	// MayHold reports whether a block may be live at now: false lets the
	// caller skip Lookup (a proxy where no block is live reads nothing).
	MayHold(now int64) bool
	// Lookup returns the block shared for descriptor key that has not
	// passed at now. Its Name is valid until the hook returns.
	Lookup(key []byte, now int64) (precheck.Block, bool)
	// Publish shares block b of descriptor key; false when it stays in
	// this worker only (err: the host refused it).
	Publish(key []byte, b precheck.Block, now int64) (bool, error)
	// Unblock ends the block shared for descriptor key, if there is one,
	// and changes the proxy's freed mark (Freed): a refund freed the key.
	Unblock(key []byte, now int64)
	// Freed returns the proxy's freed mark, which changes whenever a
	// worker unblocks a key: a worker that sees it change drops the blocks
	// it imported from the others (they are imported again if still
	// shared). A host may return what it read a few milliseconds ago.
	Freed(now int64) uint64
	// Refresh brings what the worker holds of the proxy's state up to date
	// (on the tick).
	Refresh()
	// Contention returns how many writes lost a race to another worker and
	// were tried again, and how many blocks stayed in their worker, since
	// the store was made: counts a store without races leaves at 0.
	Contention() (retries, lost int)
}

// Level is a log level.
type Level uint32

// The log levels (proxy-wasm's numbering, which Envoy's dynamic modules
// share).
const (
	LevelTrace Level = iota
	LevelDebug
	LevelInfo
	LevelWarn
	LevelError
	LevelCritical
)

// Action is what a request hook answers: go on, or wait (the core resumes
// the request or answers it locally later).
type Action uint32

// The actions (proxy-wasm's values).
const (
	Continue Action = 0
	Pause    Action = 1
)

// MetricKind is a metric's kind.
type MetricKind uint8

// The metric kinds.
const (
	Counter MetricKind = iota
	Gauge
)
