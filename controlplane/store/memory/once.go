package memory

import (
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/sluicehq/sluice/controlplane/store"
)

// Defaults for the table of applied Once tokens (store.Once).
const (
	// DefaultOnceTTL is how long an applied token is remembered.
	DefaultOnceTTL = 15 * time.Minute
	// DefaultMaxOnce bounds the tokens remembered: past it the oldest is
	// forgotten first (counted in Stats.OnceDropped). At about 150 bytes a
	// token (its id, the map slot, the ring slot) 100,000 tokens hold
	// about 15 MB.
	DefaultMaxOnce = 100_000
)

// onceTable remembers the (token, key) pairs of applied Once checks for a
// TTL, at most max of them. Every pair lives as long (the TTL), so the
// order of insertion is the order of expiry: a ring in insertion order
// serves both expiry (from its head) and the bound (drop the head early).
type onceTable struct {
	mu    sync.Mutex
	ttl   int64 // nanoseconds
	m     map[string]int64
	ring  []onceSlot // capacity max; head is the oldest
	head  int
	n     int
	max   int
	bytes int64 // the ids' bytes

	dropped atomic.Uint64 // pairs forgotten before their TTL, to respect max
}

// onceSlot is one remembered pair, in the ring.
type onceSlot struct {
	id      string // key, NUL, token
	exp     int64  // Unix ns from which the pair is forgotten
	keyLen  int    // id[:keyLen] is the key
	carried bool   // UnloadOnce reported it
}

// onceSlotBytes estimates what one remembered pair holds beyond its id's
// bytes: the ring slot and a map slot with its string header and value
// (measured: 141 bytes a pair with 42-byte ids, where this counts 144).
const onceSlotBytes = int64(unsafe.Sizeof(onceSlot{})) + 72

func newOnceTable(ttl time.Duration, max int) *onceTable {
	return &onceTable{ttl: int64(ttl), max: max, m: make(map[string]int64)}
}

// onceID returns the table's name of the pair (token, key).
func onceID(key, token string) string { return key + "\x00" + token }

// claim records the pair (token, key) as applied at now and reports true,
// or reports false when it was applied within the TTL already.
func (t *onceTable) claim(key, token string, now int64) bool {
	id := onceID(key, token)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expire(now)
	if exp, ok := t.m[id]; ok && exp > now {
		return false
	}
	if t.ring == nil {
		t.ring = make([]onceSlot, t.max) // made on first use: most stores never see a token
	}
	if t.n == len(t.ring) {
		t.pop()
		t.dropped.Add(1)
	}
	exp := now + t.ttl
	t.m[id] = exp
	t.ring[(t.head+t.n)%len(t.ring)] = onceSlot{id: id, exp: exp, keyLen: len(key)}
	t.n++
	t.bytes += (int64(len(id)) + 15) &^ 15 // as allocated
	return true
}

// release forgets the pair (token, key), whose charge failed: a retry
// must charge. Its ring slot stays until it expires; pop leaves the map
// alone then.
func (t *onceTable) release(key, token string) {
	t.mu.Lock()
	delete(t.m, onceID(key, token))
	t.mu.Unlock()
}

// unload reports the pairs remembered at now that no earlier unload
// reported to fn, at most batch per call, and marks them reported once fn
// accepts them (an error leaves them to the next unload and is returned).
func (t *onceTable) unload(now int64, batch int, fn func([]store.OnceMark) error) error {
	var marks []store.OnceMark
	var ids []string
	t.mu.Lock()
	t.expire(now)
	for i := 0; i < t.n; i++ {
		sl := &t.ring[(t.head+i)%len(t.ring)]
		if exp, ok := t.m[sl.id]; !ok || exp != sl.exp || sl.carried {
			continue // released or claimed again since, or reported
		}
		sl.carried = true
		marks = append(marks, store.OnceMark{Key: sl.id[:sl.keyLen], Token: sl.id[sl.keyLen+1:], Left: time.Duration(sl.exp - now)})
		ids = append(ids, sl.id)
	}
	t.mu.Unlock()
	for len(marks) > 0 {
		n := min(len(marks), batch)
		if err := fn(marks[:n]); err != nil {
			t.unmark(ids)
			return err
		}
		marks, ids = marks[n:], ids[n:]
	}
	return nil
}

// unmark clears the reported mark of the pairs ids, which fn refused.
func (t *onceTable) unmark(ids []string) {
	left := make(map[string]bool, len(ids))
	for _, id := range ids {
		left[id] = true
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := 0; i < t.n; i++ {
		if sl := &t.ring[(t.head+i)%len(t.ring)]; left[sl.id] {
			sl.carried = false
		}
	}
}

// expire forgets the pairs whose TTL has passed. t.mu must be held.
func (t *onceTable) expire(now int64) {
	for t.n > 0 && t.ring[t.head].exp <= now {
		t.pop()
	}
}

// pop forgets the oldest pair. t.mu must be held and t.n > 0.
func (t *onceTable) pop() {
	s := &t.ring[t.head]
	if exp, ok := t.m[s.id]; ok && exp == s.exp {
		delete(t.m, s.id) // else released, or claimed again since: a later slot holds it
	}
	t.bytes -= (int64(len(s.id)) + 15) &^ 15
	*s = onceSlot{}
	t.head = (t.head + 1) % len(t.ring)
	t.n--
}

// size returns the pairs remembered now (expired ones included until the
// next claim) and the bytes they hold, approximately.
func (t *onceTable) size() (n int, bytes int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n, t.bytes + int64(t.n)*onceSlotBytes
}
