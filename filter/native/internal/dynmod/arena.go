package dynmod

/*
#include <stdlib.h>
#include "dynmod.h"
*/
import "C"

import "unsafe"

// cArena is C memory for the headers the module hands Envoy (a local
// reply's, a callout's). cgo forbids passing C a Go array whose elements
// point into Go memory, so the names and values are copied into one C block
// behind the array of dm_header that points at them. An arena belongs to one
// thread at a time (a stream's worker, or the main thread for a Config) and
// is reused from call to call: Envoy copies the headers during the call.
type cArena struct {
	p    unsafe.Pointer
	size int
}

// headerSize is the size of one dm_header.
const headerSize = int(unsafe.Sizeof(C.dm_header{}))

// headers lays hs out in the arena and returns the array for Envoy.
func (a *cArena) headers(hs []Header) (*C.dm_header, C.size_t) {
	if len(hs) == 0 {
		return nil, 0
	}
	need := len(hs) * headerSize
	for _, h := range hs {
		need += len(h.Name) + len(h.Value)
	}
	a.grow(need)
	arr := unsafe.Slice((*C.dm_header)(a.p), len(hs))
	mem := unsafe.Slice((*byte)(a.p), a.size)
	off := len(hs) * headerSize
	for i, h := range hs {
		arr[i].key, arr[i].key_length = (*C.char)(unsafe.Add(a.p, off)), C.size_t(len(h.Name))
		off += copy(mem[off:], h.Name)
		arr[i].value, arr[i].value_length = (*C.char)(unsafe.Add(a.p, off)), C.size_t(len(h.Value))
		off += copy(mem[off:], h.Value)
	}
	return &arr[0], C.size_t(len(hs))
}

// grow makes the arena hold at least n bytes (at least one byte more, so
// that a pointer one past the last copied byte stays inside the block).
func (a *cArena) grow(n int) {
	if n < a.size {
		return
	}
	size := max(256, 2*a.size)
	for size <= n {
		size *= 2
	}
	p := C.realloc(a.p, C.size_t(size))
	if p == nil {
		panic("dynmod: out of C memory")
	}
	a.p, a.size = p, size
}

// free releases the arena's memory.
func (a *cArena) free() {
	if a.p != nil {
		C.free(a.p)
	}
	a.p, a.size = nil, 0
}
