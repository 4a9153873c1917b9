package dynmod

/*
#include "dynmod.h"
*/
import "C"

import "unsafe"

// What the binding holds in C memory, read back in Go: for its tests,
// which cannot use cgo themselves.

// readHeaders returns the n headers at p, as Envoy would read them.
func readHeaders(p *C.dm_header, n C.size_t) []Header {
	var out []Header
	for _, h := range envoyHeaders(p, n) {
		out = append(out, Header{headerName(&h), headerValue(&h)})
	}
	return out
}

// bufsOf returns module buffers over ss, as Envoy hands over body chunks.
func bufsOf(ss ...string) []C.dm_buf {
	out := make([]C.dm_buf, len(ss))
	for i, s := range ss {
		out[i] = C.dm_buf{ptr: (*C.char)(unsafe.Pointer(unsafe.StringData(s))), length: C.size_t(len(s))}
	}
	return out
}
