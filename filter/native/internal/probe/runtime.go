package main

import "sync"

// garbageRing keeps the last allocations of mode "alloc" alive for a while,
// as a filter's per-request state would be.
var garbageRing struct {
	mu   sync.Mutex
	next int
	keep [256][]byte
}

// garbage allocates n bytes and keeps them until 256 more allocations.
func garbage(n int) {
	if n <= 0 {
		return
	}
	b := make([]byte, n)
	b[0] = 1
	garbageRing.mu.Lock()
	garbageRing.keep[garbageRing.next%len(garbageRing.keep)] = b
	garbageRing.next++
	garbageRing.mu.Unlock()
}
