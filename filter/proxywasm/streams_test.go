package main

import (
	"math/rand/v2"
	"testing"
)

// TestStreamTableMatchesMap runs random puts, gets and removes on a
// streamTable and a Go map side by side, with ids both sequential (as
// proxies number contexts) and random, so that runs, wrap-around and the
// backward shift of removals all happen.
func TestStreamTableMatchesMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var tab streamTable
	ref := map[uint32]*stream{}
	next := uint32(1)
	id := func() uint32 {
		if rng.IntN(2) == 0 {
			return uint32(rng.IntN(300)) // collide with earlier ids, including 0
		}
		return next - uint32(rng.IntN(64)) // recent sequential ids
	}
	for i := 0; i < 200000; i++ {
		switch op := rng.IntN(10); {
		case op < 4:
			s := &stream{id: next}
			tab.put(next, s)
			ref[next] = s
			next++
		case op < 5:
			k := id()
			s := &stream{id: k}
			tab.put(k, s) // replaces
			ref[k] = s
		case op < 8:
			k := id()
			if got, want := tab.remove(k), ref[k]; got != want {
				t.Fatalf("remove(%d) = %p, want %p", k, got, want)
			}
			delete(ref, k)
		default:
			k := id()
			if got, want := tab.get(k), ref[k]; got != want {
				t.Fatalf("get(%d) = %p, want %p", k, got, want)
			}
		}
		if tab.len() != len(ref) {
			t.Fatalf("len %d, want %d", tab.len(), len(ref))
		}
		if 2*tab.len() > len(tab.slots) {
			t.Fatalf("%d streams in %d slots: more than half full", tab.len(), len(tab.slots))
		}
	}
	for k, s := range ref {
		if tab.get(k) != s {
			t.Fatalf("stream %d lost", k)
		}
	}
}

func TestStreamTableZeroValue(t *testing.T) {
	var tab streamTable
	if tab.get(1) != nil || tab.remove(1) != nil || tab.len() != 0 {
		t.Fatal("the empty table is not empty")
	}
}
