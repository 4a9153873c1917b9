package host

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
)

// Status is a proxy_status_t (WasmResult in proxy-wasm-cpp-host): what every
// host function returns to the guest.
type Status uint32

// Status values from the proxy-wasm ABI 0.2.1 specification and
// proxy-wasm-cpp-host's WasmResult.
const (
	StatusOK                  Status = 0
	StatusNotFound            Status = 1
	StatusBadArgument         Status = 2
	StatusSerializationFailed Status = 3
	StatusParseFailure        Status = 4
	StatusInvalidMemoryAccess Status = 6
	StatusEmpty               Status = 7
	StatusCasMismatch         Status = 8
	StatusInternalFailure     Status = 10
	StatusBrokenConnection    Status = 11
	StatusUnimplemented       Status = 12
)

// String names the status as the specification does.
func (s Status) String() string {
	switch s {
	case StatusOK:
		return "OK"
	case StatusNotFound:
		return "NOT_FOUND"
	case StatusBadArgument:
		return "BAD_ARGUMENT"
	case StatusSerializationFailed:
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
	case StatusBrokenConnection:
		return "BROKEN_CONNECTION"
	case StatusUnimplemented:
		return "UNIMPLEMENTED"
	}
	return fmt.Sprintf("Status(%d)", uint32(s))
}

// Action is a proxy_action_t: what a stream callback returns.
type Action uint32

// Action values.
const (
	ActionContinue Action = 0
	ActionPause    Action = 1
)

// LogLevel is a proxy_log_level_t.
type LogLevel uint32

// LogLevel values.
const (
	LogTrace    LogLevel = 0
	LogDebug    LogLevel = 1
	LogInfo     LogLevel = 2
	LogWarn     LogLevel = 3
	LogError    LogLevel = 4
	LogCritical LogLevel = 5
)

// String names the level.
func (l LogLevel) String() string {
	switch l {
	case LogTrace:
		return "trace"
	case LogDebug:
		return "debug"
	case LogInfo:
		return "info"
	case LogWarn:
		return "warn"
	case LogError:
		return "error"
	case LogCritical:
		return "critical"
	}
	return fmt.Sprintf("LogLevel(%d)", uint32(l))
}

// ParseLogLevel turns "trace", "debug", "info", "warn", "error" or
// "critical" into a LogLevel.
func ParseLogLevel(s string) (LogLevel, error) {
	for l := LogTrace; l <= LogCritical; l++ {
		if strings.EqualFold(s, l.String()) {
			return l, nil
		}
	}
	return 0, fmt.Errorf("log level %q: want one of trace, debug, info, warn, error, critical", s)
}

// MapType is a proxy_map_type_t.
type MapType uint32

// MapType values.
const (
	MapRequestHeaders           MapType = 0
	MapRequestTrailers          MapType = 1
	MapResponseHeaders          MapType = 2
	MapResponseTrailers         MapType = 3
	MapGrpcInitialMetadata      MapType = 4
	MapGrpcTrailingMetadata     MapType = 5
	MapHTTPCallResponseHeaders  MapType = 6
	MapHTTPCallResponseTrailers MapType = 7
)

// BufferType is a proxy_buffer_type_t.
type BufferType uint32

// BufferType values.
const (
	BufferRequestBody         BufferType = 0
	BufferResponseBody        BufferType = 1
	BufferDownstreamData      BufferType = 2
	BufferUpstreamData        BufferType = 3
	BufferHTTPCallResponse    BufferType = 4
	BufferGrpcCallMessage     BufferType = 5
	BufferVMConfiguration     BufferType = 6
	BufferPluginConfiguration BufferType = 7
	BufferForeignArguments    BufferType = 8
)

// StreamType is a proxy_stream_type_t.
type StreamType uint32

// StreamType values.
const (
	StreamRequest    StreamType = 0
	StreamResponse   StreamType = 1
	StreamDownstream StreamType = 2
	StreamUpstream   StreamType = 3
)

// MetricType is a proxy_metric_type_t.
type MetricType uint32

// MetricType values.
const (
	MetricCounter   MetricType = 0
	MetricGauge     MetricType = 1
	MetricHistogram MetricType = 2
)

// String names the metric type.
func (t MetricType) String() string {
	switch t {
	case MetricCounter:
		return "counter"
	case MetricGauge:
		return "gauge"
	case MetricHistogram:
		return "histogram"
	}
	return fmt.Sprintf("MetricType(%d)", uint32(t))
}

// Headers is an ordered list of header (or trailer, or metadata) pairs, the
// way proxy-wasm hands them to a guest: keys are lower case, pseudo-headers
// (":path", ":status", ...) are ordinary entries, and a key may repeat.
type Headers [][2]string

// Get returns the first value of key (compared case-insensitively) and
// whether it was present, like Envoy's getHeaderMapValue.
func (h Headers) Get(key string) (string, bool) {
	for _, p := range h {
		if strings.EqualFold(p[0], key) {
			return p[1], true
		}
	}
	return "", false
}

// Values returns every value of key in order.
func (h Headers) Values(key string) []string {
	var out []string
	for _, p := range h {
		if strings.EqualFold(p[0], key) {
			out = append(out, p[1])
		}
	}
	return out
}

// Clone returns a copy that shares no storage with h.
func (h Headers) Clone() Headers {
	if h == nil {
		return nil
	}
	out := make(Headers, len(h))
	copy(out, h)
	return out
}

// add appends key (lower-cased) with value.
func (h *Headers) add(key, value string) {
	*h = append(*h, [2]string{strings.ToLower(key), value})
}

// replace sets key to the single value, keeping the position of the first
// occurrence, or appends it when absent (Envoy's setCopy).
func (h *Headers) replace(key, value string) {
	key = strings.ToLower(key)
	out := (*h)[:0]
	found := false
	for _, p := range *h {
		if p[0] == key {
			if found {
				continue
			}
			found = true
			p[1] = value
		}
		out = append(out, p)
	}
	if !found {
		out = append(out, [2]string{key, value})
	}
	*h = out
}

// remove deletes every entry of key.
func (h *Headers) remove(key string) {
	key = strings.ToLower(key)
	out := (*h)[:0]
	for _, p := range *h {
		if p[0] != key {
			out = append(out, p)
		}
	}
	*h = out
}

// EncodePairs serializes pairs in the proxy-wasm map format: a little-endian
// uint32 count, count pairs of uint32 key and value lengths, then each key and
// value followed by a NUL byte. An empty list encodes to zero bytes, as
// proxy-wasm-cpp-host does.
func EncodePairs(pairs Headers) []byte {
	if len(pairs) == 0 {
		return nil
	}
	buf := make([]byte, PairsSize(pairs))
	encodePairsInto(buf, pairs)
	return buf
}

// PairsSize is the length of EncodePairs(pairs).
func PairsSize(pairs Headers) int {
	if len(pairs) == 0 {
		return 0
	}
	n := 4 + 8*len(pairs)
	for _, p := range pairs {
		n += len(p[0]) + len(p[1]) + 2
	}
	return n
}

// encodePairsInto writes the encoding of pairs into buf, which must be
// PairsSize(pairs) long.
func encodePairsInto(buf []byte, pairs Headers) {
	binary.LittleEndian.PutUint32(buf, uint32(len(pairs)))
	at := 4
	for _, p := range pairs {
		binary.LittleEndian.PutUint32(buf[at:], uint32(len(p[0])))
		binary.LittleEndian.PutUint32(buf[at+4:], uint32(len(p[1])))
		at += 8
	}
	for _, p := range pairs {
		at += copy(buf[at:], p[0])
		buf[at] = 0
		at++
		at += copy(buf[at:], p[1])
		buf[at] = 0
		at++
	}
}

// errMalformedPairs is wrapped by every DecodePairs error.
var errMalformedPairs = errors.New("malformed serialized map")

// DecodePairs parses the proxy-wasm map format. An empty input, or up to three
// zero bytes (the specification allows a single 0x00 for an empty map), is an
// empty map. Lengths that run past the end of the input are an error, never a
// panic.
func DecodePairs(b []byte) (Headers, error) {
	if len(b) < 4 {
		for _, c := range b {
			if c != 0 {
				return nil, fmt.Errorf("%w: %d bytes, too short for the pair count", errMalformedPairs, len(b))
			}
		}
		return nil, nil
	}
	n := binary.LittleEndian.Uint32(b)
	if uint64(n) > uint64(len(b)-4)/8 {
		return nil, fmt.Errorf("%w: %d pairs do not fit in %d bytes", errMalformedPairs, n, len(b))
	}
	sizes := b[4:]
	data := uint64(4 + 8*uint64(n))
	out := make(Headers, n)
	for i := range out {
		kl := uint64(binary.LittleEndian.Uint32(sizes[8*i:]))
		vl := uint64(binary.LittleEndian.Uint32(sizes[8*i+4:]))
		if data+kl+1+vl+1 > uint64(len(b)) {
			return nil, fmt.Errorf("%w: pair %d (key %d bytes, value %d bytes) runs past the end of %d bytes",
				errMalformedPairs, i, kl, vl, len(b))
		}
		out[i][0] = string(b[data : data+kl])
		data += kl + 1
		out[i][1] = string(b[data : data+vl])
		data += vl + 1
	}
	return out, nil
}
