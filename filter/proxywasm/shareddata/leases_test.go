package shareddata

import (
	"math/rand/v2"
	"strconv"
	"testing"
)

// TestLeasePoolIsEveryVMs: a lease one VM granted is spent by the others,
// unit by unit, until it is spent or expires; another key or domain has
// none.
func TestLeasePoolIsEveryVMs(t *testing.T) {
	d := newMemData()
	a, b := NewLeases(d, "edge", 64), NewLeases(d, "edge", 64)
	key := []byte("\x07api_key\x02k1")
	if b.Covers(key, 0) || b.Announced() {
		t.Fatal("a pool before any grant")
	}
	if err := a.Announce(); err != nil || !b.Announced() {
		t.Fatalf("announced: %v %v", err, b.Announced())
	}
	if took, _ := b.Take(key, 0); took.OK {
		t.Fatal("a unit taken before any grant")
	}
	if ok, err := a.Grant(key, 3, 500*ms, 100*ms); !ok || err != nil {
		t.Fatalf("grant: %v %v", ok, err)
	}
	if NewLeases(d, "other", 64).Covers(key, 100*ms) || b.Covers([]byte("\x07api_key\x02k2"), 100*ms) {
		t.Fatal("a pool crossed keys or domains")
	}
	for i, l := range []*Leases{b, a, b} {
		took, err := l.Take(key, 200*ms)
		until, ok := took.Until, took.OK
		if !ok || err != nil || until != 500*ms {
			t.Fatalf("take %d: %v %v %v", i, until, ok, err)
		}
	}
	if took, _ := a.Take(key, 200*ms); took.OK || b.Covers(key, 200*ms) {
		t.Fatal("a fourth unit of three")
	}
	// Expiry: a grant is not spent at or after its end.
	a.Grant(key, 5, 600*ms, 200*ms)
	if !b.Covers(key, 599*ms) {
		t.Fatal("the new grant is not there")
	}
	if took, _ := b.Take(key, 600*ms); took.OK || b.Covers(key, 600*ms) {
		t.Fatal("a unit spent at its expiry")
	}
	if ok, _ := a.Grant(key, 5, 600*ms, 600*ms); ok {
		t.Fatal("an expired grant was stored")
	}
}

// TestLeaseGrantsAddUp: grants to a live pool add up and end with the
// earlier expiry; a grant after the pool is spent or expired starts anew.
func TestLeaseGrantsAddUp(t *testing.T) {
	d := newMemData()
	l := NewLeases(d, "edge", 64)
	key := []byte("k")
	l.Grant(key, 2, 900*ms, 0)
	l.Grant(key, 3, 400*ms, 0)
	for i := range 5 {
		if took, _ := l.Take(key, 100*ms); !took.OK || took.Until != 400*ms {
			t.Fatalf("take %d of 2+3: %+v", i, took)
		}
	}
	if l.Covers(key, 100*ms) {
		t.Fatal("more than 2+3")
	}
	l.Grant(key, 1, 900*ms, 100*ms) // spent pool: anew, to its own end
	if took, _ := l.Take(key, 800*ms); !took.OK || took.Until != 900*ms {
		t.Fatalf("a grant after the pool was spent: %+v", took)
	}
}

// TestLeaseInterleavedVMsSpendEachUnitOnce: several VMs take from one pool
// while, before each of their writes, another VM takes a unit too (the
// host's CAS then refuses the first writer's write). Whatever the
// interleaving, the units taken add up to the units granted, never more,
// and a VM that lost every attempt reports no unit (and calls out).
func TestLeaseInterleavedVMsSpendEachUnitOnce(t *testing.T) {
	for seed := range uint64(20) {
		r := rand.New(rand.NewPCG(seed, 1))
		d := newMemData()
		vms := make([]*Leases, 4)
		for i := range vms {
			vms[i] = NewLeases(d, "edge", 16)
		}
		key := []byte("k")
		const granted = 500
		vms[0].Grant(key, 200, 1000*ms, 0)
		vms[1].Grant(key, 300, 1000*ms, 0)
		taken, refused := 0, 0
		d.beforeSet = func() {
			if r.IntN(2) == 0 { // another VM gets in first
				if took, _ := vms[r.IntN(len(vms))].Take(key, 10*ms); took.OK {
					taken++
				}
			}
		}
		for range 2 * granted {
			if took, _ := vms[r.IntN(len(vms))].Take(key, 10*ms); took.OK {
				taken++
			} else {
				refused++
			}
		}
		d.beforeSet = nil
		exhausted := 0
		for _, l := range vms {
			exhausted += l.Exhausted
		}
		if taken != granted {
			t.Fatalf("seed %d: %d units taken of %d granted (%d refused, %d exhausted)", seed, taken, granted, refused, exhausted)
		}
	}
}

// TestLeaseTakeGivesUpAfterMaxAttempts: a VM that another beats to the
// slot on every attempt stops after MaxAttempts read+write pairs and takes
// nothing; the units the others took are all that left the pool.
func TestLeaseTakeGivesUpAfterMaxAttempts(t *testing.T) {
	d := newMemData()
	l, rival := NewLeases(d, "edge", 1), NewLeases(d, "edge", 1)
	key := []byte("k")
	l.Grant(key, 100, 1000*ms, 0)
	rival.Covers(key, 0) // the rival reads the lease map
	d.beforeSet = func() { rival.Take(key, 0) }
	gets, sets := d.gets, d.sets
	if took, _ := l.Take(key, 0); took.OK {
		t.Fatal("took a unit while losing every race")
	}
	d.beforeSet = nil
	if l.Exhausted != 1 || l.Retries != MaxAttempts {
		t.Fatalf("exhausted %d, retries %d", l.Exhausted, l.Retries)
	}
	// Each attempt: one read and one refused write of its own, plus the
	// rival's read and write.
	if d.gets-gets != 2*MaxAttempts || d.sets-sets != 2*MaxAttempts {
		t.Fatalf("%d reads, %d writes for %d attempts", d.gets-gets, d.sets-sets, MaxAttempts)
	}
	n := 0
	for {
		if took, _ := l.Take(key, 0); !took.OK {
			break
		}
		n++
	}
	if n != 100-MaxAttempts {
		t.Fatalf("%d units left, want %d", n, 100-MaxAttempts)
	}
}

// TestLeaseNeverOverwritesAnotherKey: in a slot that another key's live
// pool holds (a collision), neither a grant nor a unit given back replaces
// it (replaced, the two keys' grants would replace each other and every
// unit granted to either would be lost); once it is spent or ended, the
// slot takes the other key's. No key ever spends another key's units.
func TestLeaseNeverOverwritesAnotherKey(t *testing.T) {
	d := newMemData()
	l := NewLeases(d, "edge", 1) // one slot: every key collides
	a, b := []byte("a"), []byte("b")
	l.Grant(a, 2, 1000*ms, 0)
	if l.Covers(b, 0) {
		t.Fatal("b spends a's pool")
	}
	if ok, _ := l.Give(b, 1, 1000*ms, 0); ok || !l.Covers(a, 0) || l.Lost != 1 {
		t.Fatalf("a give-back of b replaced a's live pool (lost %d)", l.Lost)
	}
	if ok, _ := l.Grant(b, 5, 1000*ms, 0); ok || !l.Covers(a, 0) || l.Covers(b, 0) || l.Lost != 2 {
		t.Fatalf("a grant of b replaced a's live pool (lost %d)", l.Lost)
	}
	l.Take(a, 0)
	l.Take(a, 0) // a's pool spent
	if ok, _ := l.Grant(b, 1, 1000*ms, 0); !ok || !l.Covers(b, 0) {
		t.Fatal("a grant of b into a spent slot was refused")
	}
	l.Take(b, 0)
	if ok, _ := l.Give(a, 1, 1000*ms, 0); !ok || !l.Covers(a, 0) {
		t.Fatal("a give-back into a spent slot was refused")
	}
	if ok, _ := l.Grant(b, 1, 2000*ms, 1000*ms); !ok || !l.Covers(b, 1000*ms) {
		t.Fatal("a grant of b into an ended slot was refused")
	}
}

// TestLeaseChurnStaysWithinBound grants 100,000 distinct keys of the
// longest length, each once the pools before it ended: the lease slots
// never hold more than LeaseBound.
func TestLeaseChurnStaysWithinBound(t *testing.T) {
	const slots = 256
	d := newMemData()
	l := NewLeases(d, "edge", slots)
	long := make([]byte, MaxKeyLen-len("edge")-1)
	for i := range 100000 {
		copy(long, strconv.Itoa(i))
		now := int64(i) * ms
		if ok, err := l.Grant(long, 10, now+ms, now); !ok || err != nil {
			t.Fatalf("grant %d: %v %v", i, ok, err)
		}
	}
	if len(d.m) > slots+2 || d.bytes()+len(onKey)+1 > LeaseBound(slots)+len(seedKey)+8 {
		t.Fatalf("%d keys, %d bytes; bound %d keys, %d bytes", len(d.m), d.bytes(), slots+2, LeaseBound(slots))
	}
	t.Logf("%d keys, %d bytes after 100000 keys (bound %d bytes; %d bytes for the plugin's %d lease slots)",
		len(d.m), d.bytes(), LeaseBound(slots), LeaseBound(LeaseSlots), LeaseSlots)
	if ok, _ := l.Grant(make([]byte, MaxKeyLen), 10, 200000*ms, 100000*ms); ok {
		t.Fatal("a key too long was shared")
	}
}

// TestDecodeLeaseRefusesWhatEncodeDidNotWrite: values of another layout or
// size are no pool.
func TestDecodeLeaseRefusesWhatEncodeDidNotWrite(t *testing.T) {
	good := encodeLease(nil, 3, 7, 5, []byte("k"))
	if l, u, a, k, ok := decodeLease(good); !ok || l != 3 || u != 7 || a != 5 || string(k) != "k" {
		t.Fatalf("round trip: %v %v %v %q %v", l, u, a, k, ok)
	}
	bad := map[string][]byte{
		"short":    good[:leaseHeader-1],
		"version":  append([]byte{9}, good[1:]...),
		"negative": encodeLease(nil, -1, 7, 0, []byte("k")),
		"long":     encodeLease(nil, 1, 7, 0, make([]byte, MaxKeyLen+1)),
		"block":    encode(nil, block(ms), []byte("k")),
	}
	for name, v := range bad {
		if _, _, _, _, ok := decodeLease(v); ok {
			t.Errorf("%s: decoded", name)
		}
	}
}

// TestProxy: the VMs of one proxy (one shared data) name it alike, another
// proxy is named apart, and the name is never 0.
func TestProxy(t *testing.T) {
	a := newMemData()
	one, two := NewLeases(a, "d", 16), NewLeases(a, "e", 16)
	other := NewLeases(newMemData(), "d", 16)
	if one.Proxy() == 0 || one.Proxy() != two.Proxy() || one.Proxy() == other.Proxy() {
		t.Fatalf("proxy %d and %d (same shared data), %d (another)", one.Proxy(), two.Proxy(), other.Proxy())
	}
}

// TestAsk: one VM's call for a key whose pool is spent is under way: other
// VMs are told to wait (Ask true) until its deadline, its grant or its
// Answered; a key without a pool, or with units, never waits.
func TestAsk(t *testing.T) {
	d := newMemData()
	a, b := NewLeases(d, "d", 16), NewLeases(d, "d", 16)
	key := []byte("k")
	const now = 1000
	if w, err := a.Ask(key, now, now+50); w || err != nil || a.Asking(key, now) {
		t.Fatalf("no pool: wait %v, %v", w, err)
	}
	if ok, err := a.Grant(key, 1, now+500, now); !ok || err != nil {
		t.Fatal(err)
	}
	if w, _ := b.Ask(key, now, now+50); w || b.Asking(key, now) {
		t.Fatal("a live pool: nobody asks")
	}
	if took, _ := a.Take(key, now); !took.OK {
		t.Fatal("take")
	}
	if w, _ := a.Ask(key, now, now+50); w || !b.Asking(key, now) {
		t.Fatal("the first to ask calls, and is seen asking")
	}
	if w, _ := b.Ask(key, now+10, now+60); !w {
		t.Fatal("the second waits")
	}
	if w, _ := b.Ask(key, now+50, now+100); w {
		t.Fatal("past the first's deadline the second calls")
	}
	if err := b.Answered(key); err != nil || a.Asking(key, now+60) {
		t.Fatalf("answered: still asking (%v)", err)
	}
	a.Ask(key, now+60, now+110)
	if ok, _ := a.Grant(key, 3, now+500, now+70); !ok || b.Asking(key, now+70) {
		t.Fatal("a grant ends the ask")
	}
	if took, _ := b.Take(key, now+70); !took.OK {
		t.Fatal("the grant's units are taken")
	}
	// A pool ended Recent ago no longer counts: the key is not leased now.
	late := now + 500 + Recent
	if !a.Holds(key, late-1) {
		t.Fatal("a pool ended less than Recent ago does not count")
	}
	if w, _ := a.Ask(key, late, late+50); w || a.Holds(key, late) || b.Asking(key, late) {
		t.Fatal("a pool ended long ago still counts")
	}
}

// TestLeaseRenewOneAtATime: a renewal is recorded only for a pool of the
// key, live or recent, with fewer units than asked, and only when no call
// for the key is under way; a grant or Answered ends it. Take reports the
// units left and the pool's end.
func TestLeaseRenewOneAtATime(t *testing.T) {
	d := newMemData()
	a, b := NewLeases(d, "edge", 64), NewLeases(d, "edge", 64)
	key := []byte("\x07api_key\x02k1")
	if ok, _ := a.Renew(key, 0, 100*ms, 1); ok {
		t.Fatal("a renewal of a key with no pool")
	}
	a.Grant(key, 3, 500*ms, 100*ms)
	if took, _ := b.Take(key, 100*ms); !took.OK || took.Left != 2 || took.Until != 500*ms {
		t.Fatalf("take: %+v", took)
	}
	if ok, _ := a.Renew(key, 100*ms, 200*ms, 2); ok {
		t.Fatal("a renewal of a pool holding as many units as asked")
	}
	if ok, _ := a.Renew(key, 100*ms, 200*ms, 3); !ok {
		t.Fatal("no renewal of a pool holding fewer units than asked")
	}
	if ok, _ := b.Renew(key, 110*ms, 210*ms, 3); ok || !b.Asking(key, 110*ms) {
		t.Fatal("two renewals at once")
	}
	if ok, _ := b.Renew(key, 200*ms, 300*ms, 3); !ok {
		t.Fatal("a renewal past the other's deadline was refused")
	}
	a.Grant(key, 2, 500*ms, 210*ms) // ends b's renewal
	if b.Asking(key, 210*ms) {
		t.Fatal("a grant did not end the renewal")
	}
	if ok, _ := a.Renew(key, 600*ms, 700*ms, 1); !ok { // ended, still recent
		t.Fatal("no renewal of a pool that just ended")
	}
	a.Answered(key)
	if b.Asking(key, 600*ms) {
		t.Fatal("Answered did not end the renewal")
	}
	if ok, _ := a.Renew(key, 500*ms+Recent, 2*Recent, 1); ok {
		t.Fatal("a renewal of a pool long gone")
	}
}
