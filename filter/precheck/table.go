package precheck

import (
	"bytes"

	"github.com/sluicehq/sluice/shared/algorithms"
)

// MaxKeyLen is the longest descriptor key the table remembers; longer keys
// are never prechecked (they still go to the control plane).
const MaxKeyLen = 512

// Verdict is the precheck's answer for one descriptor. It is kept to three
// words: in filter.wasm a larger result (the limit by value) is zeroed and
// copied through memory.fill and memory.copy, which under wazero added a
// third to the cost of Check.
type Verdict struct {
	Reject     bool  // the global limiter would reject the request
	RetryAfter int64 // with Reject: ns until the same request could pass
	// Limit is, with Reject, the limit that rejects the request, or nil
	// when the control plane reported none. It points into the table:
	// valid until the next Record.
	Limit *Limit
}

// Outcome is what the control plane said about one descriptor of a request.
type Outcome struct {
	Cost int64 // the request's cost for the descriptor
	// Limit is the limit the control plane reported for the descriptor;
	// HasLimit false means it reported none (no limit applies).
	Limit    Limit
	HasLimit bool
	// Admitted reports that the control plane admitted the whole request, so
	// the descriptor's global limit counted it.
	Admitted bool
	// OverLimit reports that this descriptor was over its limit, and
	// RetryAfter (ns, > 0) how long until the same request would be allowed
	// if nothing else arrived.
	OverLimit  bool
	RetryAfter int64
	// SentAt is when the request was sent to the control plane.
	SentAt int64
}

// entry is what the table remembers about one descriptor.
type entry struct {
	key        []byte // the descriptor key (a copy)
	hash       uint64 // hashKey of key
	prev, next int32  // LRU list, most recently used first; -1 ends it
	limit      Limit  // last limit reported
	hasLimit   bool
	hasBucket  bool
	bucket     algorithms.TokenBucket      // local bucket sized from limit
	state      algorithms.TokenBucketState // times in microseconds
	blockUntil int64                       // over-limit until this time (ns)...
	blockCost  int64                       // ...for requests costing at least this
}

// Table is the precheck of one plugin instance: a bounded map from
// descriptor key to what the control plane said about it, evicting the
// least recently used entry when full. It is not safe for concurrent use
// (a proxy-wasm VM is single-threaded).
type Table struct {
	delay   int64 // latency bound D (ns): the call timeout
	max     int   // most entries
	entries []entry
	head    int32 // most recently used; -1 when empty
	tail    int32 // least recently used
	// The index from key to entry (index.go).
	seed  uint64   // hash seed
	slots []uint32 // entry index + 1, 0 when free; a power of two long
	count int      // entries indexed
}

// NewTable returns a table of at most maxEntries descriptors for calls that
// time out after delay nanoseconds.
func NewTable(maxEntries int, delay int64) *Table {
	if maxEntries < 1 {
		maxEntries = 1
	}
	return &Table{delay: delay, max: maxEntries, head: -1, tail: -1, seed: newSeed()}
}

// Len returns the number of descriptors remembered.
func (t *Table) Len() int { return t.count }

// Check decides, at now (ns), whether a request of cost for the descriptor
// key would certainly be rejected by the global limiter. It changes no
// limiter state. It allocates nothing.
func (t *Table) Check(key []byte, cost, now int64) Verdict {
	if len(key) > MaxKeyLen {
		return Verdict{}
	}
	i := t.lookup(key, hashKey(t.seed, key))
	if i < 0 {
		return Verdict{}
	}
	if i != t.head {
		t.touch(i)
	}
	e := &t.entries[i]
	if now < e.blockUntil && cost >= e.blockCost {
		return Verdict{Reject: true, RetryAfter: e.blockUntil - now, Limit: e.limitRef()}
	}
	if e.hasBucket {
		if retry, ok := peek(&e.bucket, &e.state, now/unit, cost); !ok {
			return Verdict{Reject: true, RetryAfter: retry * unit, Limit: e.limitRef()}
		}
	}
	return Verdict{}
}

// peek reports whether bucket b in state s has room for a request of cost
// at now, and if not, how long until it would: what b.Allow(&copy, now,
// cost) decides, without changing s. A cost Allow refuses as an error
// (negative, or over the burst) is reported as room: the precheck rejects
// only what it knows the global limiter rejects.
//
// It is Allow's arithmetic (a test holds the two together) without its
// parameter checks, which the bucket passed when localBucket made it, and
// without its Result: in filter.wasm, results of more than four words are
// zeroed and copied through memory.fill and memory.copy, which cost more
// than the arithmetic.
func peek(b *algorithms.TokenBucket, s *algorithms.TokenBucketState, now, cost int64) (retryAfter int64, ok bool) {
	if cost < 0 || cost > b.Burst {
		return 0, true
	}
	used := s.Used // units missing at now, after the refill since s.Last
	if elapsed := now - s.Last; elapsed > 0 {
		if elapsed > s.Used/b.Rate {
			used = 0
		} else {
			used -= elapsed * b.Rate
		}
	}
	over := used + cost*b.Period - b.Burst*b.Period
	if over <= 0 {
		return 0, true
	}
	return (over + b.Rate - 1) / b.Rate, false
}

// limitRef returns the entry's limit, or nil if it has none.
func (e *entry) limitRef() *Limit {
	if !e.hasLimit {
		return nil
	}
	return &e.limit
}

// Record takes in, at now (ns), what the control plane said about a
// descriptor of a request.
func (t *Table) Record(key []byte, o Outcome, now int64) {
	if len(key) > MaxKeyLen {
		return
	}
	blocks := o.OverLimit && t.blockEnd(o) > now
	h := hashKey(t.seed, key)
	i := t.lookup(key, h)
	if i < 0 {
		if !o.HasLimit && !blocks {
			return // nothing worth remembering
		}
		i = t.insert(key, h)
	}
	t.touch(i)
	e := &t.entries[i]
	switch {
	case !o.HasLimit:
		e.hasLimit, e.hasBucket = false, false
	case !e.hasLimit || e.limit != o.Limit:
		// A new or changed limit: start from a full bucket, which can only
		// admit more than the truth.
		e.limit, e.hasLimit = o.Limit, true
		e.bucket, e.hasBucket = localBucket(o.Limit, t.delay)
		e.state = algorithms.TokenBucketState{}
	}
	if o.Admitted && e.hasBucket && now-o.SentAt <= t.delay && o.Cost > 0 {
		// Charge the admitted request. If the bucket has no room (possible
		// only right after it was created or resized) it stays as is, which
		// errs on the side of admitting.
		_, _ = e.bucket.Allow(&e.state, now/unit, o.Cost)
	}
	if blocks {
		until := t.blockEnd(o)
		if e.blockUntil <= now || until > e.blockUntil || (until == e.blockUntil && o.Cost < e.blockCost) {
			e.blockUntil, e.blockCost = until, o.Cost
		}
	}
}

// blockEnd returns until when a denial blocks the descriptor: the global
// decision came after SentAt, so the same request passes no earlier than
// SentAt+RetryAfter; a request rejected locally would have reached the
// global limiter up to delay later, so the block ends delay earlier; and a
// global limiter counting microseconds (Redis) may decide up to 1us early.
func (t *Table) blockEnd(o Outcome) int64 {
	if o.RetryAfter <= 0 {
		return 0
	}
	return o.SentAt + o.RetryAfter - t.delay - unit
}

// insert adds an entry for (a copy of) key, whose hash is h, evicting the
// least recently used one when the table is full, and returns its index.
func (t *Table) insert(key []byte, h uint64) int32 {
	var i int32
	if len(t.entries) < t.max {
		t.entries = append(t.entries, entry{})
		i = int32(len(t.entries) - 1)
	} else {
		i = t.tail
		t.unlink(i)
		t.indexRemove(i)
	}
	t.entries[i] = entry{key: bytes.Clone(key), hash: h, prev: -1, next: -1}
	t.indexAdd(i)
	t.pushFront(i)
	return i
}

// touch marks entry i as the most recently used.
func (t *Table) touch(i int32) {
	if t.head == i {
		return
	}
	t.unlink(i)
	t.pushFront(i)
}

func (t *Table) unlink(i int32) {
	e := &t.entries[i]
	if e.prev >= 0 {
		t.entries[e.prev].next = e.next
	} else {
		t.head = e.next
	}
	if e.next >= 0 {
		t.entries[e.next].prev = e.prev
	} else {
		t.tail = e.prev
	}
	e.prev, e.next = -1, -1
}

func (t *Table) pushFront(i int32) {
	e := &t.entries[i]
	e.prev, e.next = -1, t.head
	if t.head >= 0 {
		t.entries[t.head].prev = i
	}
	t.head = i
	if t.tail < 0 {
		t.tail = i
	}
}
