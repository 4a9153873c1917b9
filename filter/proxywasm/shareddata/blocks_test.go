package shareddata

import (
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/filter/core/precheck"
)

// memData is proxy-wasm-cpp-host's shared data (src/shared_data.cc) for one
// vm_id: a CAS number from one counter per set; a set with CAS 0, or of a
// key with no value, always succeeds; a set with another CAS than the
// key's fails with a mismatch. beforeSet, if set, runs before each set (a
// writer on another thread getting in first).
type memData struct {
	m         map[string]memValue
	next      uint32
	gets      int // of the slots (and the seed)
	sets      int
	liveCalls int // gets and sets of the live mark
	beforeSet func()
}

type memValue struct {
	v   []byte
	cas uint32
}

func newMemData() *memData { return &memData{m: map[string]memValue{}} }

func (d *memData) SharedData(key string) ([]byte, uint32, bool) {
	if key == liveKey {
		d.liveCalls++
	} else {
		d.gets++
	}
	e, ok := d.m[key]
	return e.v, e.cas, ok
}

func (d *memData) SetSharedData(key string, value []byte, cas uint32) (bool, error) {
	if f := d.beforeSet; f != nil {
		d.beforeSet = nil // not recursively
		f()
		d.beforeSet = f
	}
	if key == liveKey {
		d.liveCalls++
	} else {
		d.sets++
	}
	if e, ok := d.m[key]; ok && cas != 0 && cas != e.cas {
		return false, nil
	}
	d.next++
	if d.next == 0 {
		d.next = 1
	}
	d.m[strings.Clone(key)] = memValue{append([]byte(nil), value...), d.next}
	return true, nil
}

// bytes returns the keys' and values' total size.
func (d *memData) bytes() int {
	n := 0
	for k, v := range d.m {
		n += len(k) + len(v.v)
	}
	return n
}

const ms = int64(1e6)

var lim = precheck.Limit{Algorithm: algorithms.KindFixedWindow, Limit: 5, Window: 1000 * ms}

func block(passAt int64) precheck.Block {
	return precheck.Block{PassAt: passAt, RetryAt: passAt + 5*ms, Cost: 1, Limit: lim, HasLimit: true, Name: "per_tenant"}
}

func TestPublishedBlockIsEveryVMs(t *testing.T) {
	d := newMemData()
	a, b := New(d, "edge", 64), New(d, "edge", 64)
	if a.seed != b.seed {
		t.Fatal("two VMs of one proxy hash with different seeds")
	}
	key := []byte("\x06tenant\x02t1")
	if _, ok := b.Lookup(key, 0); ok {
		t.Fatal("a block before any was published")
	}
	if ok, err := a.Publish(key, block(900*ms), 100*ms); !ok || err != nil {
		t.Fatalf("publish: %v %v", ok, err)
	}
	got, ok := b.Lookup(key, 100*ms)
	if !ok || got != block(900*ms) {
		t.Fatalf("the other VM read %+v %v", got, ok)
	}
	if _, ok := b.Lookup(key, 900*ms); ok {
		t.Fatal("a block read after it passed")
	}
	// Another domain, another key: the same descriptor there is not blocked.
	if _, ok := New(d, "other", 64).Lookup(key, 100*ms); ok {
		t.Fatal("a block crossed domains")
	}
	if _, ok := b.Lookup([]byte("\x06tenant\x02t2"), 100*ms); ok {
		t.Fatal("a block of another key was read")
	}
}

// TestCollisionLosesNeverRejects puts many keys through few slots: a key
// whose slot another key took is not blocked (never the other's block).
func TestCollisionLosesNeverRejects(t *testing.T) {
	d := newMemData()
	s := New(d, "edge", 4)
	for i := range 100 {
		key := []byte("k" + strconv.Itoa(i))
		s.Publish(key, block(int64(1000+i)*ms), 0)
		for j := range i + 1 {
			b, ok := s.Lookup([]byte("k"+strconv.Itoa(j)), 0)
			if ok && b.PassAt != int64(1000+j)*ms {
				t.Fatalf("key %d read the block of another key: %+v", j, b)
			}
		}
		if _, ok := s.Lookup(key, 0); !ok {
			t.Fatalf("key %d: the block just published is not there", i)
		}
	}
}

// TestChurnStaysWithinBound publishes 100,000 distinct keys, with the
// longest names and keys: the shared data never holds more than the slots
// (the seed and the live mark), nor more bytes than Bound.
func TestChurnStaysWithinBound(t *testing.T) {
	const slots = 256
	d := newMemData()
	s := New(d, "edge", slots)
	name := string(make([]byte, precheck.MaxNameLen))
	long := make([]byte, MaxKeyLen-len("edge")-1)
	for i := range 100000 {
		copy(long, strconv.Itoa(i))
		b := block(int64(i+1) * ms)
		b.Name = name
		if ok, err := s.Publish(long, b, 0); !ok || err != nil {
			t.Fatalf("publish %d: %v %v", i, ok, err)
		}
	}
	if len(d.m) > slots+2 || d.bytes() > Bound(slots) {
		t.Fatalf("%d keys, %d bytes in the shared data; bound %d keys, %d bytes", len(d.m), d.bytes(), slots+2, Bound(slots))
	}
	t.Logf("%d keys, %d bytes after 100000 keys (bound %d bytes; %d bytes for the plugin's %d slots)",
		len(d.m), d.bytes(), Bound(slots), Bound(Slots), Slots)
	// A key too long to share is not.
	tooLong := make([]byte, MaxKeyLen)
	if ok, _ := s.Publish(tooLong, block(ms), 0); ok {
		t.Fatal("a key too long was shared")
	}
}

// TestWriteRetriesThenStaysLocal: a writer that another writer beats to
// the slot on every attempt gives up after MaxAttempts, with a bounded
// number of host calls; one that wins on a later attempt publishes. (The
// first write of a slot cannot lose: the host sets a key with no value
// whatever the CAS, so a rival's first write there may be overwritten,
// which loses that block, no more.)
func TestWriteRetriesThenStaysLocal(t *testing.T) {
	key, other := []byte("k"), []byte("x")
	for _, lose := range []int{1, MaxAttempts - 1, MaxAttempts, 100} {
		d := newMemData()
		s, rival := New(d, "edge", 1), New(d, "edge", 1) // one slot: every key collides
		// The slot holds a block already: a set of a key with no value
		// always succeeds in the host, whatever the CAS.
		rival.Publish(other, block(0), -1)
		lost := 0
		d.beforeSet = func() {
			if lost < lose {
				lost++
				rival.Publish(other, block(int64(lost)*ms), 0)
			}
		}
		gets, sets := d.gets, d.sets
		ok, err := s.Publish(key, block(500*ms), 0)
		wantOK := lose < MaxAttempts
		if ok != wantOK || err != nil {
			t.Fatalf("lose %d: published %v (%v), want %v", lose, ok, err, wantOK)
		}
		mine := d.sets - sets - min(lose, MaxAttempts) // the rival's sets aside
		if d.gets-gets-min(lose, MaxAttempts) > MaxAttempts || mine > MaxAttempts {
			t.Fatalf("lose %d: %d gets, %d sets of its own", lose, d.gets-gets, mine)
		}
		if s.Retries != min(lose, MaxAttempts) || s.Lost != map[bool]int{true: 0, false: 1}[wantOK] {
			t.Fatalf("lose %d: retries %d, lost %d", lose, s.Retries, s.Lost)
		}
		d.beforeSet = nil
		if _, found := s.Lookup(key, 0); found != wantOK {
			t.Fatalf("lose %d: block there %v", lose, found)
		}
	}
}

// TestPublishKeepsTheLongerBlock: a shorter block of the same key does not
// replace a longer one (no write at all); a longer one does.
func TestPublishKeepsTheLongerBlock(t *testing.T) {
	d := newMemData()
	s := New(d, "edge", 8)
	key := []byte("k")
	s.Publish(key, block(900*ms), 0)
	sets := d.sets
	if ok, _ := s.Publish(key, block(800*ms), 0); !ok || d.sets != sets {
		t.Fatalf("a shorter block was written (%v)", ok)
	}
	if b, _ := s.Lookup(key, 0); b.PassAt != 900*ms {
		t.Fatalf("passAt %d", b.PassAt)
	}
	s.Publish(key, block(1900*ms), 0)
	if b, _ := s.Lookup(key, 0); b.PassAt != 1900*ms {
		t.Fatalf("the longer block was not written: %d", b.PassAt)
	}
	if ok, _ := s.Publish(key, block(ms), 2*ms); ok {
		t.Fatal("a block already passed was published")
	}
}

// TestDecodeRefusesWhatEncodeDidNotWrite: truncated, oversized, or
// foreign values (another layout sharing the vm_id) are no block.
func TestDecodeRefusesWhatEncodeDidNotWrite(t *testing.T) {
	v := encode(nil, block(ms), []byte("edge\x00k"))
	if b, k, ok := decode(v); !ok || b != block(ms) || string(k) != "edge\x00k" {
		t.Fatalf("round trip: %+v %q %v", b, k, ok)
	}
	for n := range header + len("per_tenant") {
		if _, _, ok := decode(v[:n]); ok {
			t.Fatalf("a value cut to %d bytes decoded", n)
		}
	}
	bad := append([]byte(nil), v...)
	bad[0] = version + 1
	if _, _, ok := decode(bad); ok {
		t.Fatal("another version decoded")
	}
	if _, _, ok := decode(make([]byte, MaxValue+1)); ok {
		t.Fatal("an oversized value decoded")
	}
	d := newMemData()
	s := New(d, "edge", 1)
	for k := range d.m {
		if k != seedKey {
			t.Fatalf("unexpected key %q", k)
		}
	}
	d.m[slotPrefix+"0"] = memValue{[]byte("garbage"), 7}
	if _, ok := s.Lookup([]byte("k"), 0); ok {
		t.Fatal("garbage read as a block")
	}
	if ok, _ := s.Publish([]byte("k"), block(ms), 0); !ok {
		t.Fatal("garbage not overwritten")
	}
}

// TestSeedConverges: two VMs that set the seed at once end up hashing
// alike after a refresh.
func TestSeedConverges(t *testing.T) {
	d := newMemData()
	a := New(d, "edge", 64)
	delete(d.m, seedKey) // as if b had not seen a's seed yet
	b := New(d, "edge", 64)
	if a.seed == b.seed {
		t.Skip("the same random seed twice")
	}
	if !a.RefreshSeed() || a.seed != b.seed {
		t.Fatal("the seeds did not converge")
	}
}

// TestUnblockEndsASharedBlock: Unblock ends the shared block of a key (a
// refund freed it) and raises the freed mark, which the other VMs read at
// most once per LiveRefresh; a key without a live block changes nothing.
func TestUnblockEndsASharedBlock(t *testing.T) {
	data := NewLocal()
	a, b := New(data, "d", 16), New(data, "d", 16)
	key := []byte("api_key=k1")
	if !mustPublish(t, a, key, precheck.Block{PassAt: 100, RetryAt: 100, Cost: 1}, 0) {
		t.Fatal("not published")
	}
	if _, ok := b.Lookup(key, 10); !ok {
		t.Fatal("not shared")
	}
	mark := b.Freed(10)
	a.Unblock(key, 20)
	if _, ok := b.Lookup(key, 20); ok {
		t.Fatal("still blocked after Unblock")
	}
	if b.Freed(20) != mark {
		t.Fatal("the freed mark was read again within LiveRefresh")
	}
	if b.Freed(20+LiveRefresh) == mark {
		t.Fatal("the freed mark did not change")
	}
	a.Unblock([]byte("other"), 30)
	a.Unblock(key, 30)
	if b.Freed(30+2*LiveRefresh) != mark+1 {
		t.Fatal("an unblock without a live block raised the freed mark")
	}
}

func mustPublish(t *testing.T, s *Store, key []byte, b precheck.Block, now int64) bool {
	t.Helper()
	ok, err := s.Publish(key, b, now)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}
