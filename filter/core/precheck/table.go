package precheck

import (
	"strings"
	"unsafe"

	"github.com/sluicehq/sluice/algorithms"
)

// MaxKeyLen is the longest descriptor key the table remembers; longer keys
// are never prechecked (they still go to the control plane).
const MaxKeyLen = 512

// MaxNameLen is the longest limit name the table remembers; a longer name is
// remembered as "" (no name).
const MaxNameLen = 256

// FailureMode is what the control plane said should happen to a request for
// a descriptor when the control plane cannot be asked.
type FailureMode uint8

// The failure modes.
const (
	FailureUnknown FailureMode = iota // not said: the filter's own failure mode applies
	FailureOpen                       // let the request through
	FailureClosed                     // refuse it
)

// String returns the mode's name in the sluice metadata ("" when unknown).
func (m FailureMode) String() string {
	switch m {
	case FailureOpen:
		return "open"
	case FailureClosed:
		return "closed"
	}
	return ""
}

// Policy is what the control plane last reported about a descriptor's limit.
type Policy struct {
	Limit Limit
	// Name is the limit's name (RLS current_limit.name), "" when the
	// control plane gave none.
	Name string
	// Version identifies this Limit and Name: it changes whenever either
	// does, and no two entries of a table ever share one, so that whatever
	// is derived from a policy (a reply's headers) can be cached under it.
	Version uint64
}

// Verdict is the precheck's answer for one descriptor. It is kept to three
// words: in filter.wasm a larger result (the limit by value) is zeroed and
// copied through memory.fill and memory.copy, which under wazero added a
// third to the cost of Check.
type Verdict struct {
	Reject bool // the global limiter would reject the request
	// RetryAfter is, with Reject, how long (ns) the client should wait
	// before it sends the same request again: for a descriptor the control
	// plane denied, until its retry-after counted from the arrival of its
	// answer, which the control plane's decision preceded, so that a client
	// retrying then is not refused again for lack of waiting (the local
	// block itself ends earlier, see Record); for a local bucket with no
	// room, until it has room.
	RetryAfter int64
	// Policy is, with Reject, the limit that rejects the request, or nil
	// when the control plane reported none. It points into the table:
	// valid until the next Record.
	Policy *Policy
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
	// Name is the limit's name (RLS current_limit.name), "" for none. The
	// table keeps a copy.
	Name string
	// FailureMode is the descriptor's failure mode as the control plane
	// reported it; FailureUnknown when it reported none.
	FailureMode FailureMode
}

// entry is what the table remembers about one descriptor.
type entry struct {
	key        []byte // the descriptor key (a copy)
	hash       uint64 // hashKey of key
	prev, next int32  // LRU list, most recently used first; -1 ends it
	policy     Policy // last limit reported, with its name
	hasLimit   bool
	hasBucket  bool
	bucket     algorithms.TokenBucket      // local bucket sized from policy.Limit
	state      algorithms.TokenBucketState // times in microseconds
	blockUntil int64                       // over-limit until this time (ns)...
	blockCost  int64                       // ...for requests costing at least this
	retryUntil int64                       // during the block: the time a client is told to retry at (ns)
	// failureMode is the failure mode last reported for the descriptor.
	failureMode FailureMode
	// gen tells this key's entry from another key's in the same place
	// (a later insert): a deferred charge names both (deferred.go).
	gen uint32
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
	// version is the last Policy.Version given out.
	version uint64

	// the local bucket of the last limit recorded for a new limit: every
	// key of a rate limit has the same, and localBucket costs more than
	// the rest of recording a key (128-bit division) in filter.wasm
	lastLimit  Limit
	lastBucket algorithms.TokenBucket
	lastOK     bool
	haveLast   bool

	// charges waits for the time (deferred.go); gen numbers inserts.
	charges []charge
	gen     uint32
}

// NewTable returns a table of at most maxEntries descriptors for calls that
// time out after delay nanoseconds.
func NewTable(maxEntries int, delay int64) *Table {
	if maxEntries < 1 {
		maxEntries = 1
	}
	return &Table{delay: delay, max: maxEntries, head: -1, tail: -1, seed: newSeed()}
}

// Bound returns the most bytes a table of at most maxEntries descriptors
// holds live: its entries (the slice's capacity at most twice its length),
// each one's copy of its key (at most MaxKeyLen bytes) and of its limit's
// name (at most MaxNameLen), with the allocator's rounding (at most 1/8),
// and its index (at most half full: fewer than 4*maxEntries slots of 4
// bytes). A garbage-collected heap may hold as much again of what evicted
// entries left.
func Bound(maxEntries int) int {
	maxEntries = max(maxEntries, 1)
	return maxEntries * (2*int(unsafe.Sizeof(entry{})) + (MaxKeyLen+MaxNameLen)*9/8 + 4*4)
}

// Len returns the number of descriptors remembered.
func (t *Table) Len() int { return t.count }

// Check decides, at now (ns), whether a request of cost for the descriptor
// key would certainly be rejected by the global limiter. It changes no
// limiter state. It allocates nothing.
func (t *Table) Check(key []byte, cost, now int64) Verdict {
	if len(t.charges) > 0 {
		t.Settle(now)
	}
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
		return Verdict{Reject: true, RetryAfter: e.retryUntil - now, Policy: e.policyRef()}
	}
	if e.hasBucket {
		if retry, ok := peek(&e.bucket, &e.state, now/unit, cost); !ok {
			return Verdict{Reject: true, RetryAfter: retry * unit, Policy: e.policyRef()}
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
	over := usedAt(b, s, now) + cost*b.Period - b.Burst*b.Period
	if over <= 0 {
		return 0, true
	}
	return (over + b.Rate - 1) / b.Rate, false
}

// usedAt returns what bucket b in state s misses at now, after the refill
// since s.Last (Allow's arithmetic; small enough to be inlined).
func usedAt(b *algorithms.TokenBucket, s *algorithms.TokenBucketState, now int64) int64 {
	elapsed := now - s.Last
	switch {
	case elapsed <= 0:
		return s.Used
	case elapsed > s.Used/b.Rate:
		return 0
	}
	return s.Used - elapsed*b.Rate
}

// policyRef returns the entry's policy, or nil if it has no limit.
func (e *entry) policyRef() *Policy {
	if !e.hasLimit {
		return nil
	}
	return &e.policy
}

// FailureMode returns the failure mode the control plane last reported for
// the descriptor key: FailureUnknown when it reported none or the table
// does not remember the key.
func (t *Table) FailureMode(key []byte) FailureMode {
	if len(key) > MaxKeyLen {
		return FailureUnknown
	}
	i := t.lookup(key, hashKey(t.seed, key))
	if i < 0 {
		return FailureUnknown
	}
	return t.entries[i].failureMode
}

// Record takes in, at now (ns), what the control plane said about a
// descriptor of a request; now is when its answer arrived.
//
// A denial blocks the descriptor locally until blockEnd, and rejected
// requests are told to retry at now+RetryAfter: the control plane decided
// before its answer arrived, so by then the same request passes if nothing
// else came. The block ends earlier, by up to twice the call timeout, so as
// never to reject what the global limiter would allow.
func (t *Table) Record(key []byte, o Outcome, now int64) {
	if len(t.charges) > 0 {
		t.Settle(now)
	}
	b, blocks := BlockOf(o, now)
	t.record(key, &o, &b, blocks, true, now)
}

// Block is a denial as the Wasm VMs of one proxy share it (see Import):
// what one VM heard from the control plane, in the proxy's monotonic clock,
// without the VM's own call timeout.
type Block struct {
	// PassAt is the earliest time the same request can pass the global
	// limiter: the denied call's SentAt plus the retry-after it was given.
	PassAt int64
	// RetryAt is when clients rejected on the block are told to retry.
	RetryAt int64
	Cost    int64 // the denied request's cost: the block holds for costs at least this
	// Limit, HasLimit and Name are the descriptor's limit as the denial
	// reported it, for the headers of local replies.
	Limit    Limit
	HasLimit bool
	Name     string
}

// BlockOf returns the block that a denial o, whose answer arrived at now,
// teaches; ok is false when o is no denial with a retry-after.
func BlockOf(o Outcome, now int64) (b Block, ok bool) {
	if !o.OverLimit || o.RetryAfter <= 0 {
		return Block{}, false
	}
	return Block{PassAt: o.SentAt + o.RetryAfter, RetryAt: now + o.RetryAfter, Cost: o.Cost,
		Limit: o.Limit, HasLimit: o.HasLimit, Name: o.Name}, true
}

// Import takes in, at now, a block that another VM of the proxy (or this
// one) learnt: until PassAt, less this table's call timeout and 1us, the
// descriptor is rejected for costs of at least b.Cost, exactly as if this
// table had recorded the denial itself. A block already over changes
// nothing. The descriptor's failure mode is left as it was.
func (t *Table) Import(key []byte, b Block, now int64) {
	if len(t.charges) > 0 {
		t.Settle(now)
	}
	if t.blockEnd(b) <= now {
		return
	}
	o := Outcome{Cost: b.Cost, Limit: b.Limit, HasLimit: b.HasLimit, OverLimit: true, Name: b.Name}
	t.record(key, &o, &b, true, false, now)
}

// record is Record and Import: o's limit and name, o's failure mode if
// setFailure, and the block b if blocks. It returns the key's entry, -1
// when the table does not remember the key. o and b are pointers: in
// filter.wasm a struct passed by value is copied through memory.
func (t *Table) record(key []byte, o *Outcome, b *Block, blocks, setFailure bool, now int64) int32 {
	if len(key) > MaxKeyLen {
		return -1
	}
	until := t.blockEnd(*b)
	blocks = blocks && until > now
	h := hashKey(t.seed, key)
	i := t.lookup(key, h)
	if i < 0 {
		if !o.HasLimit && !blocks && (!setFailure || o.FailureMode == FailureUnknown) {
			return -1 // nothing worth remembering
		}
		if !setFailure && !blocks {
			return -1 // an import teaches only its block
		}
		i = t.insert(key, h)
	}
	t.touch(i)
	e := &t.entries[i]
	if setFailure {
		e.failureMode = o.FailureMode
	}
	switch {
	case !o.HasLimit:
		e.hasLimit, e.hasBucket = false, false
	case !e.hasLimit || e.policy.Limit != o.Limit:
		// A new or changed limit: start from a full bucket, which can only
		// admit more than the truth.
		e.policy.Limit, e.hasLimit = o.Limit, true
		e.bucket, e.hasBucket = t.localBucket(o.Limit)
		e.state = algorithms.TokenBucketState{}
		t.version++
		e.policy.Version = t.version
	}
	if name := o.Name; e.hasLimit && e.policy.Name != name {
		if len(name) > MaxNameLen {
			name = ""
		}
		if e.policy.Name != name {
			e.policy.Name = strings.Clone(name)
			t.version++
			e.policy.Version = t.version
		}
	}
	if o.Admitted && e.hasBucket && now-o.SentAt <= t.delay && o.Cost > 0 {
		// Charge the admitted request. If the bucket has no room (possible
		// only right after it was created or resized) it stays as is, which
		// errs on the side of admitting.
		take(&e.bucket, &e.state, now/unit, o.Cost)
	}
	if blocks {
		retry := max(b.RetryAt, until)
		active := e.blockUntil > now
		if !active || until > e.blockUntil || (until == e.blockUntil && b.Cost < e.blockCost) {
			e.blockUntil, e.blockCost = until, b.Cost
		}
		// The later of the retry times: telling a client to wait longer
		// than needed is safe, shorter is not.
		if !active || retry > e.retryUntil {
			e.retryUntil = retry
		}
	}
	return i
}

// blockEnd returns until when a block holds here: the global decision came
// after the denied call was sent, so the same request passes no earlier
// than PassAt; a request rejected locally would have reached the global
// limiter up to delay later, so the block ends delay earlier; and a global
// limiter counting microseconds (Redis) may decide up to 1us early.
// localBucket is localBucket(l, t.delay), remembered for the last l.
func (t *Table) localBucket(l Limit) (algorithms.TokenBucket, bool) {
	if !t.haveLast || t.lastLimit != l {
		t.lastBucket, t.lastOK = localBucket(l, t.delay)
		t.lastLimit, t.haveLast = l, true
	}
	return t.lastBucket, t.lastOK
}

func (t *Table) blockEnd(b Block) int64 {
	if b.PassAt == 0 {
		return 0
	}
	return b.PassAt - t.delay - unit
}

// insert adds an entry for (a copy of) key, whose hash is h, evicting the
// least recently used one when the table is full, and returns its index.
func (t *Table) insert(key []byte, h uint64) int32 {
	var i int32
	var buf []byte
	if len(t.entries) < t.max {
		t.entries = append(t.entries, entry{})
		i = int32(len(t.entries) - 1)
	} else {
		i = t.tail
		t.unlink(i)
		t.indexRemove(i)
		// The evicted key's memory, when the new key fits: a full table
		// allocates nothing, and a copy is never bigger than one clone of
		// a key (Bound).
		if old := t.entries[i].key; cap(old) >= len(key) {
			buf = old[:0]
		}
	}
	t.gen++
	t.entries[i] = entry{key: append(buf, key...), hash: h, prev: -1, next: -1, gen: t.gen}
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

// Blocks reports whether block b still blocks at now in this table (its
// PassAt less the call timeout and 1us is later).
func (t *Table) Blocks(b Block, now int64) bool { return t.blockEnd(b) > now }
