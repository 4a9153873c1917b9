package envoystate

import (
	"runtime"
	"strconv"
	"sync"
	"testing"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/filter/core/lease"
	"github.com/sluicehq/sluice/filter/core/precheck"
)

const ms = int64(1e6)

func block(passAt int64) precheck.Block {
	return precheck.Block{PassAt: passAt, RetryAt: passAt + 5*ms, Cost: 1, HasLimit: true, Name: "per_tenant",
		Limit: precheck.Limit{Algorithm: algorithms.KindFixedWindow, Limit: 5, Window: 1000 * ms}}
}

// TestBlocksSharedByWorkers: a block one worker publishes is every
// worker's until it passes, in its domain only, for its key only.
func TestBlocksSharedByWorkers(t *testing.T) {
	d, other := Acquire("edge"), Acquire("other")
	defer d.Release()
	defer other.Release()
	a, b := d.Blocks(), d.Blocks()
	key := []byte("\x06tenant\x02t1")
	if b.MayHold(0) {
		t.Fatal("a fresh domain may hold a block")
	}
	if ok, err := a.Publish(key, block(900*ms), 100*ms); !ok || err != nil {
		t.Fatalf("publish: %v %v", ok, err)
	}
	if !b.MayHold(100*ms) || b.MayHold(900*ms) {
		t.Fatal("the live mark does not end with the block")
	}
	if got, ok := b.Lookup(key, 100*ms); !ok || got != block(900*ms) {
		t.Fatalf("the other worker read %+v %v", got, ok)
	}
	for name, look := range map[string]func() bool{
		"passed":       func() bool { _, ok := b.Lookup(key, 900*ms); return ok },
		"other domain": func() bool { _, ok := other.Blocks().Lookup(key, 100*ms); return ok },
		"other key":    func() bool { _, ok := b.Lookup([]byte("\x06tenant\x02t2"), 100*ms); return ok },
	} {
		if look() {
			t.Errorf("%s: a block was read", name)
		}
	}
	// A shorter block of the same key does not replace a longer one.
	a.Publish(key, block(500*ms), 100*ms)
	if got, _ := b.Lookup(key, 100*ms); got.PassAt != 900*ms {
		t.Errorf("a shorter block replaced the longer: %+v", got)
	}
}

// TestBlocksCollisionLosesNeverRejects: keys that share slots never read
// each other's blocks.
// TestUnblockFreesTheKeyForEveryWorker: a refund that frees a key ends its
// shared block and raises the freed mark the workers watch; a key without
// a live block changes neither.
func TestUnblockFreesTheKeyForEveryWorker(t *testing.T) {
	d := Acquire("refund")
	defer d.Release()
	a, b := d.Blocks(), d.Blocks()
	key, other := []byte("\x06tenant\x02t1"), []byte("\x06tenant\x02t2")
	a.Publish(key, block(900*ms), 100*ms)
	for _, c := range []struct {
		name      string
		key       []byte
		now       int64
		wantFreed uint64
		wantHeld  bool
	}{
		{"another key", other, 200 * ms, 0, true},
		{"the block passed", key, 900 * ms, 0, true},
		{"the key", key, 200 * ms, 1, false},
		{"again", key, 200 * ms, 1, false},
	} {
		b.Unblock(c.key, c.now)
		_, held := a.Lookup(key, 200*ms)
		if got := a.Freed(c.now); got != c.wantFreed || held != c.wantHeld {
			t.Errorf("%s: freed %d, block held %v; want %d, %v", c.name, got, held, c.wantFreed, c.wantHeld)
		}
	}
}

func TestBlocksCollisionLosesNeverRejects(t *testing.T) {
	d := Acquire("collide")
	defer d.Release()
	s := d.Blocks()
	for i := range 3 * Slots {
		s.Publish([]byte("k"+strconv.Itoa(i)), block(int64(1000+i)*ms), 0)
	}
	for i := range 3 * Slots {
		if b, ok := s.Lookup([]byte("k"+strconv.Itoa(i)), 0); ok && b.PassAt != int64(1000+i)*ms {
			t.Fatalf("key %d read the block of another key: %+v", i, b)
		}
	}
}

// TestPoolsSpendEachUnitOnce: workers taking from one pool at once spend
// each unit exactly once.
func TestPoolsSpendEachUnitOnce(t *testing.T) {
	d := Acquire("spend")
	defer d.Release()
	key := []byte("k")
	d.Pools().Grant(key, 1000, 10_000*ms, 0)
	var mu sync.Mutex
	taken := 0
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			p := d.Pools()
			n := 0
			for range 200 {
				if took, _ := p.Take(key, 1); took.OK {
					n++
				}
			}
			mu.Lock()
			taken += n
			mu.Unlock()
		})
	}
	wg.Wait()
	if taken != 1000 {
		t.Fatalf("8 workers took %d units of a pool of 1000", taken)
	}
}

// TestPools walks the lease.Pools contract on synthetic time.
func TestPools(t *testing.T) {
	d := Acquire("pools")
	defer d.Release()
	a, b := d.Pools(), d.Pools()
	key, other := []byte("k"), collider([]byte("k"))
	if a.Caller() == 0 || a.Caller() != b.Caller() || a.Caller() == OwnPools().Caller() {
		t.Fatal("callers: the process's must be one, non-zero, and not a worker's own")
	}
	if b.Announced() {
		t.Fatal("announced before any lease")
	}
	a.Announce()
	if !b.Announced() {
		t.Fatal("an announcement is not every worker's")
	}
	steps := []struct {
		name string
		do   func() any
		want any
	}{
		{"nothing to take", func() any { took, _ := b.Take(key, 0); return took }, lease.Took{}},
		{"grant", func() any { ok, _ := a.Grant(key, 2, 100*ms, 0); return ok }, true},
		{"grants add up, ending first", func() any { ok, _ := b.Grant(key, 1, 50*ms, 0); return ok }, true},
		{"take", func() any { took, _ := b.Take(key, 10*ms); return took }, lease.Took{OK: true, Recent: true, Left: 2, Until: 50 * ms}},
		{"covers", func() any { return a.Covers(key, 10*ms) }, true},
		{"another key's give-back is lost over a live pool", func() any { ok, _ := a.Give(other, 1, 60*ms, 10*ms); return ok }, false},
		{"...and the pool is intact", func() any { return a.Covers(key, 10*ms) }, true},
		{"no ask while live", func() any { w, _ := a.Ask(key, 10*ms, 20*ms); return w }, false},
		{"take the rest", func() any {
			b.Take(key, 11*ms)
			took, _ := b.Take(key, 12*ms)
			return took
		}, lease.Took{OK: true, Recent: true, Left: 0, Until: 50 * ms}},
		{"empty: recent, not covered", func() any { return [2]bool{a.Holds(key, 12*ms), a.Covers(key, 12*ms)} }, [2]bool{true, false}},
		{"the first ask calls", func() any { w, _ := a.Ask(key, 12*ms, 112*ms); return w }, false},
		{"the second waits", func() any { w, _ := b.Ask(key, 13*ms, 113*ms); return w }, true},
		{"asking", func() any { return b.Asking(key, 13*ms) }, true},
		{"no renewal while asking", func() any { r, _ := b.Renew(key, 14*ms, 114*ms, 1); return r }, false},
		{"answered", func() any { a.Answered(key); return b.Asking(key, 14*ms) }, false},
		{"one renewal", func() any { r, _ := a.Renew(key, 14*ms, 114*ms, 1); return r }, true},
		{"not two", func() any { r, _ := b.Renew(key, 15*ms, 115*ms, 1); return r }, false},
		{"a grant ends the renewal", func() any { a.Grant(key, 5, 200*ms, 16*ms); return b.Asking(key, 16*ms) }, false},
		{"ended long ago: not recent", func() any { return a.Holds(key, 200*ms+lease.Recent) }, false},
		{"a give-back into an ended pool", func() any { ok, _ := a.Give(key, 1, 300*ms, 250*ms); return ok }, true},
	}
	for _, s := range steps {
		if got := s.do(); got != s.want {
			t.Fatalf("%s: got %+v, want %+v", s.name, got, s.want)
		}
	}
}

// TestReleaseDropsTheDomain: the last configuration of a domain drops its
// state; one still in use keeps it.
func TestReleaseDropsTheDomain(t *testing.T) {
	first := Acquire("reload")
	first.Pools().Grant([]byte("k"), 3, 100*ms, 0)
	second := Acquire("reload") // the new configuration, before the old one goes
	first.Release()
	if !second.Pools().Covers([]byte("k"), ms) {
		t.Fatal("the pool did not survive a configuration replaced")
	}
	second.Release()
	third := Acquire("reload")
	defer third.Release()
	if third.Pools().Covers([]byte("k"), ms) {
		t.Fatal("the pool survived its domain's last configuration")
	}
}

// TestChurnStaysWithinBound publishes blocks and grants pools for 100,000
// distinct keys, the longest there are: the heap grows by less than Bound.
func TestChurnStaysWithinBound(t *testing.T) {
	d := Acquire("churn")
	defer d.Release()
	blocks, pools := d.Blocks(), d.Pools()
	before := heap()
	name := string(make([]byte, precheck.MaxNameLen))
	key := make([]byte, MaxKeyLen)
	for i := range 100_000 {
		copy(key, strconv.Itoa(i))
		b := block(int64(i+1) * ms)
		b.Name = name
		if ok, _ := blocks.Publish(key, b, 0); !ok {
			t.Fatalf("publish %d", i)
		}
		pools.Grant(key, 10, int64(i+1)*ms, 0)
	}
	grew := heap() - before
	t.Logf("heap grew %d bytes over 100,000 keys; bound %d bytes per domain", grew, Bound())
	if grew > int64(Bound()) {
		t.Fatalf("heap grew %d bytes, past the bound %d", grew, Bound())
	}
	if ok, _ := blocks.Publish(make([]byte, MaxKeyLen+1), block(ms), 0); ok {
		t.Fatal("a key too long was shared")
	}
}

// collider returns a key other than key in the same slot.
func collider(key []byte) []byte {
	for i := 0; ; i++ {
		if k := []byte("x" + strconv.Itoa(i)); slotOf(k) == slotOf(key) {
			return k
		}
	}
}

// heap returns the live heap after a collection.
func heap() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}
