package abi

import "unsafe"

// arena hands out the memory the host asks for with
// proxy_on_memory_allocate. It is reset when a top-level callback begins
// (depth 0): everything handed out during a callback stays referenced, and
// so alive, until then.
type arena struct {
	buf    []byte   // the scratch memory
	off    int      // first free byte of buf
	depth  int      // callbacks in progress (a host may call back from inside a host call)
	pinned [][]byte // allocations too large for buf, kept alive until the reset
	// bodyOff and bodyPinned mark where the callback's first body read
	// began (bodyOff -1: none yet): each later one begins there again.
	bodyOff, bodyPinned int
}

// newArena returns an arena of size bytes.
func newArena(size int) *arena { return &arena{buf: make([]byte, size), bodyOff: -1} }

// rewindBody makes the callback's next allocation reuse the memory of its
// last body read, if it made one: a body read in slices takes one slice
// of memory, however long the body.
func (a *arena) rewindBody() {
	if a.bodyOff < 0 {
		a.bodyOff, a.bodyPinned = a.off, len(a.pinned)
		return
	}
	a.off = a.bodyOff
	clear(a.pinned[a.bodyPinned:])
	a.pinned = a.pinned[:a.bodyPinned]
}

// enter marks the start of a callback, resetting the arena if no other
// callback is in progress.
func (a *arena) enter() {
	if a.depth == 0 {
		a.off, a.bodyOff = 0, -1
		clear(a.pinned)
		a.pinned = a.pinned[:0]
	}
	a.depth++
}

// leave marks the end of a callback.
func (a *arena) leave() {
	if a.depth > 0 {
		a.depth--
	}
}

// alloc returns n bytes, 8-byte aligned, valid until the arena is reset.
// It never returns nil: a zero-byte allocation gets a valid address.
func (a *arena) alloc(n int) unsafe.Pointer {
	if n < 0 {
		return nil
	}
	start := (a.off + 7) &^ 7
	if start+n <= len(a.buf) && n > 0 {
		a.off = start + n
		return unsafe.Pointer(&a.buf[start])
	}
	if n == 0 {
		return unsafe.Pointer(&a.buf[0])
	}
	b := make([]byte, n)
	a.pinned = append(a.pinned, b)
	return unsafe.Pointer(&b[0])
}
