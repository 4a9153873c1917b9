package abi

import (
	"testing"
	"unsafe"
)

func TestArena(t *testing.T) {
	a := newArena(64)
	a.enter()
	p1 := a.alloc(3)
	p2 := a.alloc(8)
	if uintptr(p2)%8 != 0 || uintptr(p2)-uintptr(p1) != 8 {
		t.Fatalf("allocations not aligned: %p %p", p1, p2)
	}
	if a.alloc(0) == nil {
		t.Fatal("zero-byte allocation returned nil")
	}
	big := a.alloc(100) // does not fit: from the heap, pinned
	if len(a.pinned) != 1 || unsafe.Pointer(&a.pinned[0][0]) != big {
		t.Fatal("large allocation not pinned")
	}
	// A nested callback must not reset the arena under the outer one.
	a.enter()
	p3 := a.alloc(8)
	a.leave()
	if p3 == p1 || len(a.pinned) != 1 {
		t.Fatal("nested callback reset the arena")
	}
	a.leave()
	// The next top-level callback starts over.
	a.enter()
	if a.alloc(3) != p1 || len(a.pinned) != 0 {
		t.Fatal("arena not reset at the next callback")
	}
	a.leave()
	if a.alloc(-1) != nil {
		t.Fatal("negative allocation succeeded")
	}
}

func TestStatusError(t *testing.T) {
	if StatusOK.err() != nil || StatusNotFound.err() == nil || StatusBadArgument.Error() != "BAD_ARGUMENT" || Status(99).Error() != "UNKNOWN_STATUS" {
		t.Fatal("Status errors wrong")
	}
}

// TestArenaRewindsBodyReads: each body read of a callback reuses the
// memory of the one before (what came before the first stays), so a body
// read in slices takes one slice of memory, large ones included.
func TestArenaRewindsBodyReads(t *testing.T) {
	a := newArena(64)
	a.enter()
	header := a.alloc(8)
	a.rewindBody()
	first := a.alloc(16)
	for range 10 {
		a.rewindBody()
		if p := a.alloc(16); p != first {
			t.Fatal("a body read did not reuse the last one's memory")
		}
		a.rewindBody()
		a.alloc(1000) // too large: pinned, then dropped by the next read
		if len(a.pinned) != 1 {
			t.Fatalf("%d pinned", len(a.pinned))
		}
	}
	a.rewindBody()
	if len(a.pinned) != 0 || a.alloc(8) == header {
		t.Fatal("the memory before the first body read was reused")
	}
	a.leave()
	a.enter() // the next callback starts over, its first read marks anew
	a.alloc(40)
	a.rewindBody()
	if p := a.alloc(8); p == first {
		t.Fatal("a new callback's body read reused the last callback's mark")
	}
	a.leave()
}
