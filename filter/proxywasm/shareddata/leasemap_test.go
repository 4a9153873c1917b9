package shareddata

import (
	"strconv"
	"testing"
)

// TestLeaseMapSkipsSlotsWithoutPools: a key whose slot never held a pool
// reads no slot, whatever the lease operation: a VM reads the lease map
// once per LiveRefresh, and that is all.
func TestLeaseMapSkipsSlotsWithoutPools(t *testing.T) {
	d := newMemData()
	a, b := NewLeases(d, "d", 4096), NewLeases(d, "d", 4096)
	if ok, _ := a.Grant([]byte("leased"), 10, 10*Recent, 0); !ok {
		t.Fatal("grant")
	}
	gets := d.gets
	for i := range 1000 {
		key := []byte("spread-" + strconv.Itoa(i))
		now := int64(i) * 1000 // 1000 operations in 1 ms
		if took, _ := b.Take(key, now); took.OK || took.Recent || b.Covers(key, now) || b.Holds(key, now) || b.Asking(key, now) {
			t.Fatalf("key %d: a pool where there is none", i)
		}
		if w, _ := b.Ask(key, now, now+50); w {
			t.Fatalf("key %d: waits for a call", i)
		}
	}
	// Keys that share the leased key's slot read it: at most a few of the
	// 1000, with 4096 slots.
	if n := d.gets - gets; n > 1+10 {
		t.Fatalf("%d reads for 1000 keys without pools, want the lease map's one", n)
	}
	if took, _ := b.Take([]byte("leased"), 0); !took.OK {
		t.Fatal("the leased key's unit was not seen")
	}
}

// TestLeaseMapSeesAGrantWithinLiveRefresh: a pool another VM granted is
// seen once the lease map is read again, LiveRefresh later at most; until
// then the VM calls (admits less, never more).
func TestLeaseMapSeesAGrantWithinLiveRefresh(t *testing.T) {
	d := newMemData()
	a, b := NewLeases(d, "d", 64), NewLeases(d, "d", 64)
	key := []byte("k")
	if took, _ := b.Take(key, 0); took.OK { // b reads the map at 0
		t.Fatal("a unit before any grant")
	}
	a.Grant(key, 5, 10*Recent, 1)
	if took, _ := b.Take(key, LiveRefresh-1); took.OK {
		t.Fatal("b read the map again before LiveRefresh")
	}
	if took, _ := b.Take(key, LiveRefresh); !took.OK {
		t.Fatal("b does not see a's pool LiveRefresh after it last read the map")
	}
}

// TestLeaseMapForgetsEndedPools: a slot whose pool ended Recent ago loses
// its bit (then its keys read no slot), unless a grant marked the map
// since the clearing VM read it: the grant keeps its bit.
func TestLeaseMapForgetsEndedPools(t *testing.T) {
	d := newMemData()
	a, b := NewLeases(d, "d", 64), NewLeases(d, "d", 64)
	key := []byte("k")
	a.Grant(key, 1, 100, 0)
	late := 100 + Recent
	b.Holds(key, late) // reads the map and the slot: the pool is over; the bit goes
	gets := d.gets
	if b.Holds(key, late+1) || d.gets != gets {
		t.Fatalf("%d reads of a slot whose bit went", d.gets-gets)
	}
	a.Grant(key, 1, late+2*Recent, late)
	c := NewLeases(d, "d", 64)
	if !c.Covers(key, late) {
		t.Fatal("a new grant is not seen")
	}

	// The race: b read the map (bit set), then reads an ended pool; a
	// grant to the slot came between the two: b's clear fails.
	b2 := NewLeases(d, "d", 64)
	end := late + 2*Recent + Recent
	b2.Covers([]byte("other"), end) // b2 reads the map at end
	a.Grant(key, 3, end+Recent, end)
	b2.slot(key)
	b2.unmark() // what b2 would do had it read the slot before the grant
	c2 := NewLeases(d, "d", 64)
	if !c2.Covers(key, end) {
		t.Fatal("a clear based on an older map removed a grant's bit")
	}
}
