package grpcunary

import (
	"context"
	"errors"
	"strconv"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// encoder writes the header blocks of one connection's answers. The two
// fields every OK answer repeats, content-type: application/grpc and
// grpc-status: 0, are added to the peer's HPACK dynamic table by the first
// OK answer and sent as one-byte references after that, which spares the
// peer (Envoy, or any gRPC client) decoding them on every call. Nothing
// else ever enters the table: error answers are literals "without
// indexing" (RFC 7541, 6.2.2). The entries take 104 bytes of the table.
//
// A peer that makes its SETTINGS_HEADER_TABLE_SIZE smaller than the table
// in use gets a dynamic table size update at the start of the next block
// (RFC 7541, 4.2: nghttp2, and so Envoy, rejects a block without it); if
// the entries no longer fit, it gets literals from then on.
type encoder struct {
	literal    bool   // never use the dynamic table
	ctIn, gsIn bool   // content-type, then grpc-status, are in the peer's table
	shrunk     bool   // the table's size is size, not the initial 4096
	size       uint32 // the table size in use, once shrunk
	resize     bool   // the next block starts with a size update to size
}

// initialTableSize is the HPACK table size before any setting (RFC 9113,
// 6.5.2).
const initialTableSize = 4096

// tableBytes is what the two entries take in the dynamic table (RFC 7541,
// 4.1: 32 bytes each plus the name and value lengths).
const tableBytes = (32 + len("content-type") + len("application/grpc")) + (32 + len("grpc-status") + len("0"))

// tableSize is the size of the peer's table as the blocks sent so far (and
// a pending update) set it.
func (e *encoder) tableSize() uint32 {
	if e.shrunk {
		return e.size
	}
	return initialTableSize
}

// setTableSize follows the peer's SETTINGS_HEADER_TABLE_SIZE, limit. A
// larger limit changes nothing: the table in use still fits it.
func (e *encoder) setTableSize(limit uint32) {
	if limit >= e.tableSize() {
		return
	}
	e.shrunk, e.size, e.resize = true, limit, true
	if int(limit) < tableBytes {
		// The update evicts the entries, or some of them.
		e.literal, e.ctIn, e.gsIn = true, false, false
	}
}

// start begins a block: the pending size update, if any.
func (e *encoder) start(b []byte) []byte {
	if e.resize {
		e.resize = false
		b = appendInt(b, 5, 0x20, uint64(e.size)) // dynamic table size update (RFC 7541, 6.3)
	}
	return b
}

// headers appends the block of an OK answer's headers.
func (e *encoder) headers(b []byte) []byte {
	b = append(e.start(b), 0x80|8) // :status: 200, static entry 8
	switch {
	case e.literal:
		return appendField(b, "content-type", "application/grpc")
	case !e.ctIn:
		e.ctIn = true
		b = append(b, 0x40|31) // literal with incremental indexing, static name 31 (content-type)
		return appendString(b, "application/grpc")
	case e.gsIn:
		return append(b, 0x80|63) // grpc-status came in after it
	}
	return append(b, 0x80|62)
}

// trailers appends the block of an OK answer's trailers.
func (e *encoder) trailers(b []byte) []byte {
	b = e.start(b)
	switch {
	case e.literal:
		return appendField(b, "grpc-status", "0")
	case !e.gsIn:
		e.gsIn = true
		b = append(b, 0x40) // literal with incremental indexing, new name
		b = appendString(b, "grpc-status")
		return appendString(b, "0")
	}
	return append(b, 0x80|62) // the newest entry
}

// maxMessageLen bounds a grpc-message (after percent-encoding), so that a
// trailers-only block always fits one frame of the smallest
// SETTINGS_MAX_FRAME_SIZE.
const maxMessageLen = 1024

// appendTrailersOnly appends the block of a trailers-only answer: an error.
func appendTrailersOnly(b []byte, code codes.Code, msg string) []byte {
	b = append(b, 0x80|8) // :status: 200
	b = appendField(b, "content-type", "application/grpc")
	b = appendField(b, "grpc-status", strconv.Itoa(int(code)))
	if msg != "" {
		b = appendField(b, "grpc-message", encodeMessage(msg))
	}
	return b
}

// appendHTTPStatus appends the block of an HTTP answer without body, for a
// request that is not a gRPC call. The grpc-status lets gRPC clients that
// still read it report something meaningful.
func appendHTTPStatus(b []byte, httpStatus int) []byte {
	b = appendStatus(b, httpStatus)
	code := codes.Internal
	switch httpStatus {
	case 405, 415:
		code = codes.Unimplemented
	case 431:
		code = codes.ResourceExhausted
	}
	return appendField(b, "grpc-status", strconv.Itoa(int(code)))
}

// appendStatus appends :status: 200 as static entry 8, any other as a
// literal with the static name :status.
func appendStatus(b []byte, httpStatus int) []byte {
	if httpStatus == 200 {
		return append(b, 0x80|8)
	}
	b = appendInt(b, 4, 0x00, 8) // literal without indexing, name index 8
	return appendString(b, strconv.Itoa(httpStatus))
}

// appendField appends a literal field without indexing, with a new name.
func appendField(b []byte, name, value string) []byte {
	b = append(b, 0x00)
	b = appendString(b, name)
	return appendString(b, value)
}

// appendString appends a string literal without Huffman coding.
func appendString(b []byte, s string) []byte {
	b = appendInt(b, 7, 0x00, uint64(len(s)))
	return append(b, s...)
}

// appendInt appends v as an HPACK integer with an n-bit prefix, the rest of
// the first byte being first (RFC 7541, 5.1).
func appendInt(b []byte, n uint, first byte, v uint64) []byte {
	limit := uint64(1)<<n - 1
	if v < limit {
		return append(b, first|byte(v))
	}
	b = append(b, first|byte(limit))
	v -= limit
	for v >= 128 {
		b = append(b, byte(v&0x7f|0x80))
		v >>= 7
	}
	return append(b, byte(v))
}

// encodeMessage percent-encodes a grpc-message as the gRPC HTTP/2 protocol
// says: bytes outside 0x20-0x7E, and '%', become %XX. It cuts the result at
// maxMessageLen bytes, between whole characters.
func encodeMessage(msg string) string {
	const hex = "0123456789ABCDEF"
	b := make([]byte, 0, min(len(msg), maxMessageLen))
	for i := 0; i < len(msg); {
		_, size := utf8.DecodeRuneInString(msg[i:])
		n := 0
		for _, c := range []byte(msg[i : i+size]) {
			if c >= 0x20 && c <= 0x7e && c != '%' {
				n++
			} else {
				n += 3
			}
		}
		if len(b)+n > maxMessageLen {
			break
		}
		for _, c := range []byte(msg[i : i+size]) {
			if c >= 0x20 && c <= 0x7e && c != '%' {
				b = append(b, c)
			} else {
				b = append(b, '%', hex[c>>4], hex[c&15])
			}
		}
		i += size
	}
	return string(b)
}

// statusOf returns the gRPC code and message of a handler's error.
func statusOf(err error) (codes.Code, string) {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		if _, ok := status.FromError(err); !ok {
			s := status.FromContextError(err)
			return s.Code(), s.Message()
		}
	}
	s, _ := status.FromError(err)
	return s.Code(), s.Message()
}

// parseTimeout reads a grpc-timeout value: at most 8 digits and a unit
// (H, M, S, m, u, n).
func parseTimeout(v string) (d time.Duration, ok bool) {
	if len(v) < 2 || len(v) > 9 {
		return 0, false
	}
	var n int64
	for _, c := range []byte(v[:len(v)-1]) {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	var unit int64
	switch v[len(v)-1] {
	case 'H':
		unit = 3600e9
	case 'M':
		unit = 60e9
	case 'S':
		unit = 1e9
	case 'm':
		unit = 1e6
	case 'u':
		unit = 1e3
	case 'n':
		unit = 1
	default:
		return 0, false
	}
	const maxDuration = 1<<63 - 1
	if n > maxDuration/unit {
		return maxDuration, true
	}
	return time.Duration(n * unit), true
}
