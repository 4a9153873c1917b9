package shareddata

import "testing"

// TestMayHoldSeesABlockWithinLiveRefresh: with no block live in the proxy
// a VM reads the live mark once per LiveRefresh and no slot; a block
// another VM publishes is seen at the VM's first read of the mark after
// the publication, at most LiveRefresh later; while a block is live the
// VM reads the slots (MayHold true) and not the mark; once every block
// has passed, the mark is read again.
func TestMayHoldSeesABlockWithinLiveRefresh(t *testing.T) {
	d := newMemData()
	a, b := New(d, "edge", 8), New(d, "edge", 8)
	key := []byte("k")
	calls := func() int { n := d.liveCalls; d.liveCalls = 0; return n }

	const t0 = 1000 * ms
	for _, tt := range []struct {
		at    int64
		may   bool
		calls int // reads of the mark
	}{
		{t0, false, 1},
		{t0 + LiveRefresh - 1, false, 0},
		{t0 + LiveRefresh, false, 1},
		{t0 + LiveRefresh/2, true, 1}, // a clock that went back: read again (after A's publication below)
	} {
		if tt.at == t0+LiveRefresh/2 {
			if ok, err := a.Publish(key, block(t0+900*ms), t0+LiveRefresh/2); !ok || err != nil {
				t.Fatalf("publish: %v %v", ok, err)
			}
			calls()
		}
		if got := b.MayHold(tt.at); got != tt.may || calls() != tt.calls {
			t.Fatalf("at %d: MayHold %v, want %v", tt.at-t0, got, tt.may)
		}
	}

	// C, a VM started later, reads the mark: A's block is live.
	c := New(d, "edge", 8)
	other := []byte("other")
	c.MayHold(t0 + 5*LiveRefresh) // reads the mark: A's block is live
	if c.liveUntil != t0+900*ms {
		t.Fatalf("mark %d, want %d", c.liveUntil, t0+900*ms)
	}
	// Every block has passed: C reads the mark again, finds it over, and
	// trusts that for LiveRefresh; a block A publishes meanwhile is seen
	// at C's first read after that.
	late := t0 + 900*ms
	if c.MayHold(late) {
		t.Fatal("a passed block is live")
	}
	calls()
	if c.MayHold(late + 1) {
		t.Fatal("a passed block is live")
	}
	if calls() != 0 {
		t.Fatal("the mark was read again within LiveRefresh")
	}
	if ok, _ := a.Publish(other, block(late+900*ms), late+1); !ok {
		t.Fatal("publish")
	}
	if c.MayHold(late+LiveRefresh-1) || !c.MayHold(late+LiveRefresh) {
		t.Fatal("a block published 1ns after the mark's read was not seen exactly LiveRefresh after that read")
	}
	if _, found := c.Lookup(other, late+LiveRefresh); !found {
		t.Fatal("the block the mark announced is not in its slot")
	}
	// While it is live, MayHold reads nothing.
	calls()
	if !c.MayHold(late+10*LiveRefresh) || calls() != 0 {
		t.Fatal("the mark was read while a block was live")
	}
}

// TestPublishRaisesTheMarkOnce: a VM raises the mark with one read and
// one write per block that lasts longer than any it knows of; publishing
// again a block no longer than the mark it knows makes no call on it.
func TestPublishRaisesTheMarkOnce(t *testing.T) {
	d := newMemData()
	a := New(d, "edge", 8)
	a.Publish([]byte("k1"), block(500*ms), 0)
	if d.liveCalls != 2 || a.liveUntil != 500*ms {
		t.Fatalf("%d calls on the mark, mark %d", d.liveCalls, a.liveUntil)
	}
	d.liveCalls = 0
	a.Publish([]byte("k2"), block(400*ms), 0) // ends earlier: the mark stays
	a.Publish([]byte("k1"), block(500*ms), 0) // as good a block is there
	if d.liveCalls != 0 {
		t.Fatalf("%d calls on the mark for blocks it covers", d.liveCalls)
	}
	b := New(d, "edge", 8)
	b.Publish([]byte("k3"), block(300*ms), 0) // B has not read the mark: it reads it, finds it higher
	if d.liveCalls != 1 || b.liveUntil != 500*ms {
		t.Fatalf("%d calls on the mark, B's mark %d", d.liveCalls, b.liveUntil)
	}
}
