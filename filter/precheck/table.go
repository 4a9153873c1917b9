package precheck

import "github.com/sluicehq/sluice/shared/algorithms"

// MaxKeyLen is the longest descriptor key the table remembers; longer keys
// are never prechecked (they still go to the control plane).
const MaxKeyLen = 512

// Verdict is the precheck's answer for one descriptor.
type Verdict struct {
	Reject     bool  // the global limiter would reject the request
	RetryAfter int64 // with Reject: ns until the same request could pass
	Limit      Limit // with Reject and HasLimit: the limit that rejects it
	HasLimit   bool
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
	key        string
	prev, next int32 // LRU list, most recently used first; -1 ends it
	limit      Limit // last limit reported
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
	index   map[string]int32
	head    int32 // most recently used; -1 when empty
	tail    int32 // least recently used
}

// NewTable returns a table of at most maxEntries descriptors for calls that
// time out after delay nanoseconds.
func NewTable(maxEntries int, delay int64) *Table {
	if maxEntries < 1 {
		maxEntries = 1
	}
	return &Table{delay: delay, max: maxEntries, index: make(map[string]int32), head: -1, tail: -1}
}

// Len returns the number of descriptors remembered.
func (t *Table) Len() int { return len(t.index) }

// Check decides, at now (ns), whether a request of cost for the descriptor
// key would certainly be rejected by the global limiter. It changes no
// limiter state. It allocates nothing.
func (t *Table) Check(key []byte, cost, now int64) Verdict {
	if len(key) > MaxKeyLen {
		return Verdict{}
	}
	i, ok := t.index[string(key)]
	if !ok {
		return Verdict{}
	}
	e := &t.entries[i]
	t.touch(i)
	if now < e.blockUntil && cost >= e.blockCost {
		return Verdict{Reject: true, RetryAfter: e.blockUntil - now, Limit: e.limit, HasLimit: e.hasLimit}
	}
	if e.hasBucket {
		s := e.state // peek: decide on a copy
		r, err := e.bucket.Allow(&s, now/unit, cost)
		if err == nil && !r.Allowed {
			return Verdict{Reject: true, RetryAfter: r.RetryAfter * unit, Limit: e.limit, HasLimit: e.hasLimit}
		}
	}
	return Verdict{}
}

// Record takes in, at now (ns), what the control plane said about a
// descriptor of a request.
func (t *Table) Record(key []byte, o Outcome, now int64) {
	if len(key) > MaxKeyLen {
		return
	}
	blocks := o.OverLimit && t.blockEnd(o) > now
	i, ok := t.index[string(key)]
	if !ok {
		if !o.HasLimit && !blocks {
			return // nothing worth remembering
		}
		i = t.insert(string(key))
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

// insert adds an entry for key, evicting the least recently used one when
// the table is full, and returns its index.
func (t *Table) insert(key string) int32 {
	var i int32
	if len(t.entries) < t.max {
		t.entries = append(t.entries, entry{})
		i = int32(len(t.entries) - 1)
	} else {
		i = t.tail
		t.unlink(i)
		delete(t.index, t.entries[i].key)
	}
	t.entries[i] = entry{key: key, prev: -1, next: -1}
	t.index[key] = i
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
