package dynmod

// #include "dynmod.h"
import "C"

import (
	"strings"
	"unsafe"
)

// HeaderMap is one of a stream's header maps (Stream.Headers): request or
// response headers or trailers, which exist from their hook on.
type HeaderMap struct {
	envoy unsafe.Pointer
	kind  HeaderKind
}

// Get returns a copy of the value of the header name (lower case), the first one if it has several.
func (h HeaderMap) Get(name string) (string, bool) {
	v, ok := h.view(name, 0)
	return strings.Clone(v), ok
}

// Append appends the value of the header name to dst: Get without
// an allocation when dst has room.
func (h HeaderMap) Append(dst []byte, name string) ([]byte, bool) {
	v, ok := h.view(name, 0)
	return append(dst, v...), ok
}

// View returns the value of the header name without copying it: a
// view of Envoy's memory, valid until the hook returns or a header of the
// map is set, whichever comes first. For a caller that reads a header
// during a hook and copies what it keeps.
func (h HeaderMap) View(name string) (string, bool) {
	return h.view(name, 0)
}

// Values returns a copy of every value of the header name.
func (h HeaderMap) Values(name string) []string {
	var n C.size_t
	var b C.dm_buf
	if !C.dm_http_get_header(h.envoy, C.dm_enum(h.kind), strBuf(name), &b, 0, &n) {
		return nil
	}
	out := make([]string, 0, int(n))
	out = append(out, strings.Clone(view(b)))
	for i := 1; i < int(n); i++ {
		v, _ := h.view(name, i)
		out = append(out, strings.Clone(v))
	}
	return out
}

// view returns the index-th value of name in Envoy's memory.
func (h HeaderMap) view(name string, index int) (string, bool) {
	var b C.dm_buf
	if !C.dm_http_get_header(h.envoy, C.dm_enum(h.kind), strBuf(name), &b, C.size_t(index), nil) {
		return "", false
	}
	return view(b), true
}

// All returns a copy of every header of the map, in order.
func (h HeaderMap) All() []Header {
	n := C.dm_http_get_headers_size(h.envoy, C.dm_enum(h.kind))
	if n == 0 {
		return nil
	}
	hs := make([]C.dm_header, int(n))
	if !C.dm_http_get_headers(h.envoy, C.dm_enum(h.kind), &hs[0]) {
		return nil
	}
	out := make([]Header, len(hs))
	for i := range hs {
		out[i] = Header{strings.Clone(headerName(&hs[i])), strings.Clone(headerValue(&hs[i]))}
	}
	return out
}

// Add adds a value to the header name, keeping the
// values it has; an empty value adds nothing. It reports whether the map
// exists at this point of the stream.
func (h HeaderMap) Add(name, value string) bool {
	return bool(C.dm_http_add_header(h.envoy, C.dm_enum(h.kind), strBuf(name), strBuf(value)))
}

// Set replaces the values of the header name with value; an empty
// value removes the header.
func (h HeaderMap) Set(name, value string) bool {
	return bool(C.dm_http_set_header(h.envoy, C.dm_enum(h.kind), strBuf(name), strBuf(value)))
}

// Remove removes the header name.
func (h HeaderMap) Remove(name string) bool {
	return h.Set(name, "")
}
