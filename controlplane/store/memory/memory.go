package memory

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/store"
)

// Defaults for Options.
const (
	// DefaultMaxEntries is the default bound on keys held (about 280 MB
	// with keys of 60 bytes: DefaultMaxBytes binds first).
	DefaultMaxEntries = 1 << 20
	// DefaultMaxBytes is the default bound on the bytes held.
	DefaultMaxBytes = 256 << 20
	// MaxSlidingLog is the largest sliding_log limit the store accepts: the
	// log holds one 16-byte slot per request of the limit (16 MB here).
	// Policies allow far less (policy.MaxSlidingLog).
	MaxSlidingLog = 1 << 20
)

// shardCount is the number of shards: enough that 2 to 64 cores rarely
// meet on one mutex.
const shardCount = 64

// Sizes used for the byte bound, measured on the Go heap (TestByteAccounting
// checks them against runtime.MemStats for every algorithm and key length).
const (
	// mapSlotBytes is an entry's share of the shard map: a 16-byte key
	// header and an 8-byte pointer per slot, at the load of a Swiss table
	// that has just split (about 7/16), with the control bytes.
	mapSlotBytes = 64
	// logStateSize is a sliding log's state struct, beside its ring.
	logStateSize = int64(unsafe.Sizeof(algorithms.SlidingLogState{}))
	logEntrySize = 16 // one slot of a sliding log's ring
)

// entryOverhead is the entry struct as allocated (its size rounded up to
// the Go allocator's size class: 232 bytes make 240) and its map slot. It
// follows the struct, so a field added to entry or to store.Limit cannot
// leave the byte bound counting too little.
var entryOverhead = sizeClass(int64(unsafe.Sizeof(entry{}))) + mapSlotBytes

// sizeClass rounds n up to the size class the Go allocator serves it from,
// for the sizes an entry can have (up to 512 bytes; above, to 64).
func sizeClass(n int64) int64 {
	switch {
	case n <= 256:
		return (n + 15) &^ 15
	case n <= 512:
		return (n + 31) &^ 31
	}
	return (n + 63) &^ 63
}

// entrySize returns the bytes an entry for key holds, with a sliding log
// of logCap slots (0: none). The key's bytes are counted as allocated:
// rounded up to 16.
func entrySize(key string, logCap int64) int64 {
	n := entryOverhead + (int64(len(key))+15)&^15
	if logCap > 0 {
		n += logStateSize + logCap*logEntrySize
	}
	return n
}

// Options configures a Store. The zero value is usable.
type Options struct {
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// MaxEntries bounds the keys held; 0 means DefaultMaxEntries. It is
	// divided evenly among the shards (at least one entry each).
	MaxEntries int
	// MaxBytes bounds the approximate bytes held; 0 means DefaultMaxBytes.
	// It is divided evenly among the shards. One entry larger than its
	// shard's share (a huge sliding log) is still kept, alone.
	MaxBytes int64
	// OnceTTL is how long an applied store.Once token is remembered; 0
	// means DefaultOnceTTL.
	OnceTTL time.Duration
	// MaxOnce bounds the tokens remembered; 0 means DefaultMaxOnce. Past
	// it the oldest is forgotten first (Stats.OnceDropped).
	MaxOnce int
}

// Store is the in-process store. It is safe for concurrent use.
type Store struct {
	now    func() time.Time
	seed   maphash.Seed
	shards [shardCount]shard
	once   *onceTable

	evicted atomic.Uint64 // live entries dropped to respect the bounds
	expired atomic.Uint64 // expired entries dropped by Sweep
}

// shard is one lock's worth of entries, with an LRU list.
type shard struct {
	mu         sync.Mutex
	m          map[string]*entry
	lru        entry // sentinel: lru.next is the most recent, lru.prev the least
	bytes      int64 // approximate bytes held
	maxEntries int
	maxBytes   int64
	_          [64]byte // keep neighbouring shards' mutexes off one cache line
}

// entry is the state of one key.
type entry struct {
	key     string
	alg     algorithms.Kind
	logCap  int64 // sliding_log: the limit the ring was sized for
	expires int64 // Unix ns from which the state equals a fresh one
	size    int64 // approximate bytes, for the shard's total
	limit   store.Limit

	shift   int64     // fixed_window, sliding_window: added to the clock, so that a seeded entry's windows are the primary's (carry.go)
	seed    seedState // as seeded by the primary, or as last carried to it (carry.go)
	carried bool      // seed was carried: the primary has it

	prev, next *entry // LRU list

	fw  algorithms.FixedWindowState
	sw  algorithms.SlidingWindowState
	tb  algorithms.TokenBucketState
	gc  algorithms.GCRAState
	rs  algorithms.ReserveState
	log *algorithms.SlidingLogState
}

// Stats are counters describing a Store.
type Stats struct {
	Entries int    // keys held now
	Bytes   int64  // approximate bytes held now
	Evicted uint64 // live entries dropped to respect the bounds, ever
	Expired uint64 // expired entries dropped by Sweep, ever

	Once        int    // Once tokens remembered now
	OnceBytes   int64  // approximate bytes they hold
	OnceDropped uint64 // tokens forgotten before their TTL to respect MaxOnce, ever
}

// New returns an empty Store.
func New(opts Options) *Store {
	s := &Store{now: opts.Now, seed: maphash.MakeSeed()}
	if s.now == nil {
		s.now = time.Now
	}
	maxEntries := opts.MaxEntries
	if maxEntries <= 0 {
		maxEntries = DefaultMaxEntries
	}
	maxBytes := opts.MaxBytes
	if maxBytes <= 0 {
		maxBytes = DefaultMaxBytes
	}
	onceTTL, maxOnce := opts.OnceTTL, opts.MaxOnce
	if onceTTL <= 0 {
		onceTTL = DefaultOnceTTL
	}
	if maxOnce <= 0 {
		maxOnce = DefaultMaxOnce
	}
	s.once = newOnceTable(onceTTL, maxOnce)
	for i := range s.shards {
		sh := &s.shards[i]
		sh.m = make(map[string]*entry)
		sh.lru.next, sh.lru.prev = &sh.lru, &sh.lru
		sh.maxEntries = max(1, maxEntries/shardCount)
		sh.maxBytes = max(1, maxBytes/shardCount)
	}
	return s
}

// Name returns "memory".
func (s *Store) Name() string { return "memory" }

// Decide implements store.Store. Every check is validated before any state
// changes, so an invalid check (an error wrapping store.ErrInvalidLimit)
// leaves the store as it was.
func (s *Store) Decide(ctx context.Context, checks []store.Check, out []algorithms.Result) error {
	if len(out) != len(checks) {
		return fmt.Errorf("memory: %d results for %d checks", len(out), len(checks))
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	for i := range checks {
		if err := validate(&checks[i]); err != nil {
			return fmt.Errorf("%w: checks[%d] (%s): %w", store.ErrInvalidLimit, i, checks[i].Limit.Algorithm, err)
		}
	}
	now := s.now().UnixNano()
	for i := range checks {
		c := &checks[i]
		var r algorithms.Result
		var err error
		if c.Once != nil {
			r, err = s.decideOnce(c, now)
		} else {
			r, err = s.shardOf(c.Key).decide(c, now, &s.evicted)
		}
		if err != nil {
			return fmt.Errorf("memory: checks[%d]: %w", i, err)
		}
		out[i] = r
	}
	return nil
}

// decideOnce decides a check with a Once: the charge or refund if its pair
// was not applied within the TTL, then a Probe of the key (see store.Once).
func (s *Store) decideOnce(c *store.Check, now int64) (algorithms.Result, error) {
	sh := s.shardOf(c.Key)
	c.Once.Duplicate = !s.once.claim(c.Key, c.Once.Token, now)
	if !c.Once.Duplicate {
		if _, err := sh.decide(c, now, &s.evicted); err != nil {
			s.once.release(c.Key, c.Once.Token)
			return algorithms.Result{}, err
		}
	}
	probe := store.Check{Key: c.Key, Limit: c.Limit, Mode: store.Probe}
	return sh.decide(&probe, now, &s.evicted)
}

// shardOf returns the shard holding key.
func (s *Store) shardOf(key string) *shard {
	return &s.shards[maphash.String(s.seed, key)%shardCount]
}

// Sweep drops every entry whose state has expired (equals a fresh one) and
// returns how many it dropped. It locks one shard at a time.
func (s *Store) Sweep() int {
	now := s.now().UnixNano()
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for e := sh.lru.prev; e != &sh.lru; {
			prev := e.prev
			if e.expires <= now {
				sh.remove(e)
				n++
			}
			e = prev
		}
		sh.mu.Unlock()
	}
	s.expired.Add(uint64(n))
	return n
}

// RunSweeper calls Sweep every interval until ctx is done.
func (s *Store) RunSweeper(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.Sweep()
		}
	}
}

// Stats returns the store's counters.
func (s *Store) Stats() Stats {
	st := Stats{Evicted: s.evicted.Load(), Expired: s.expired.Load(), OnceDropped: s.once.dropped.Load()}
	st.Once, st.OnceBytes = s.once.size()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		st.Entries += len(sh.m)
		st.Bytes += sh.bytes
		sh.mu.Unlock()
	}
	return st
}

// decide applies one check to the shard's state for its key.
func (sh *shard) decide(c *store.Check, now int64, evicted *atomic.Uint64) (algorithms.Result, error) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.m[c.Key]
	if e != nil && !e.fits(c.Limit) {
		// Made for another algorithm, or a log too small for a raised
		// limit: start over from a fresh state.
		sh.remove(e)
		e = nil
	}
	if e == nil {
		if c.Cost == 0 || c.Mode == store.Refund {
			// Nothing to store: a probe of a fresh limiter answers the
			// same, and a refund finds nothing to give back.
			return freshPeek(c.Limit, now), nil
		}
		e = &entry{key: c.Key, alg: c.Limit.Algorithm}
		if e.alg == algorithms.KindSlidingLog {
			e.logCap = c.Limit.Requests
			e.log = slidingLog(c.Limit, nil).NewState()
		}
		e.size = entrySize(c.Key, e.logCap)
	}
	r, err := e.apply(c, now)
	if err != nil {
		return r, err
	}
	e.limit = c.Limit
	if r.ResetAfter <= 0 || (e.alg == algorithms.KindFixedWindow && r.Remaining == r.Limit) {
		// The limiter is full (a fixed window with nothing counted answers
		// the time until it ends): a missing entry means the same.
		if e.prev != nil {
			sh.remove(e)
		}
		return r, nil
	}
	e.expires = now + r.ResetAfter
	if e.prev == nil {
		sh.insert(e, evicted)
	} else {
		sh.touch(e)
	}
	return r, nil
}

// fits reports whether e's state can serve limit l.
func (e *entry) fits(l store.Limit) bool {
	return e.alg == l.Algorithm && (e.alg != algorithms.KindSlidingLog || e.logCap >= l.Requests)
}

// insert adds e as the most recent entry, evicting the least recent ones
// while the shard is over a bound.
func (sh *shard) insert(e *entry, evicted *atomic.Uint64) {
	sh.m[e.key] = e
	sh.bytes += e.size
	e.prev, e.next = &sh.lru, sh.lru.next
	e.next.prev = e
	sh.lru.next = e
	for len(sh.m) > sh.maxEntries || sh.bytes > sh.maxBytes {
		victim := sh.lru.prev
		if victim == e {
			break // e alone is over the byte share: keep it
		}
		sh.remove(victim)
		evicted.Add(1)
	}
}

// touch makes e the most recent entry.
func (sh *shard) touch(e *entry) {
	if sh.lru.next == e {
		return
	}
	e.prev.next, e.next.prev = e.next, e.prev
	e.prev, e.next = &sh.lru, sh.lru.next
	e.next.prev = e
	sh.lru.next = e
}

// remove drops e from the shard.
func (sh *shard) remove(e *entry) {
	delete(sh.m, e.key)
	sh.bytes -= e.size
	e.prev.next, e.next.prev = e.next, e.prev
	e.prev, e.next = nil, nil
}

// apply decides c against e's state. c has been validated and fits has
// sized the log, so the algorithms do not refuse it; should they, the state
// is unchanged and the error is returned.
func (e *entry) apply(c *store.Check, now int64) (algorithms.Result, error) {
	l := c.Limit
	at := now + e.shift // the clock of fixed_window's and sliding_window's windows
	switch l.Algorithm {
	case algorithms.KindFixedWindow:
		return checkOn(fixedWindow(l, l.Periods(at)), &e.fw, c.Mode, at, c.Cost)
	case algorithms.KindSlidingWindow:
		return checkOn(slidingWindow(l, l.Periods(at)), &e.sw, c.Mode, at, c.Cost)
	case algorithms.KindSlidingLog:
		return checkOn(slidingLog(l, l.Periods(now)), e.log, c.Mode, now, c.Cost)
	case algorithms.KindTokenBucket:
		return checkOn(tokenBucket(l), &e.tb, c.Mode, now, c.Cost)
	case algorithms.KindGCRA:
		return checkOn(gcra(l), &e.gc, c.Mode, now, c.Cost)
	case algorithms.KindReserve:
		return checkOn(reserve(l), &e.rs, c.Mode, now, c.Cost)
	}
	return algorithms.Result{}, errUnknown
}

// limiter is what every algorithm of package algorithms offers on its state S.
type limiter[S any] interface {
	Allow(s S, now, cost int64) (algorithms.Result, error)
	Probe(s S, now int64) (algorithms.Result, error)
	Charge(s S, now, cost int64) (algorithms.Result, error)
	Refund(s S, now, amount int64) (algorithms.Result, error)
}

// checkOn is the check of mode (Allow unless Probe, Charge or Refund) on s.
func checkOn[L limiter[S], S any](lim L, s S, mode store.Mode, now, cost int64) (algorithms.Result, error) {
	switch mode {
	case store.Probe:
		return lim.Probe(s, now)
	case store.Charge:
		return lim.Charge(s, now, cost)
	case store.Refund:
		return lim.Refund(s, now, cost)
	}
	return lim.Allow(s, now, cost)
}

// errUnknown is returned for an algorithm validate would have refused.
var errUnknown = errors.New("memory: unknown algorithm")

// freshPeek returns what a cost-0 check answers against a fresh limiter at
// now (a fixed window's ResetAfter is the time until its window ends).
func freshPeek(l store.Limit, now int64) algorithms.Result {
	var r algorithms.Result
	switch l.Algorithm {
	case algorithms.KindFixedWindow:
		r, _ = fixedWindow(l, l.Periods(now)).Allow(&algorithms.FixedWindowState{}, now, 0)
	case algorithms.KindSlidingWindow:
		r, _ = slidingWindow(l, nil).Allow(&algorithms.SlidingWindowState{}, 0, 0)
	case algorithms.KindSlidingLog:
		r = algorithms.Result{Allowed: true, Limit: l.Requests, Remaining: l.Requests}
	case algorithms.KindTokenBucket:
		r, _ = tokenBucket(l).Allow(&algorithms.TokenBucketState{}, 0, 0)
	case algorithms.KindGCRA:
		r, _ = gcra(l).Allow(&algorithms.GCRAState{}, 0, 0)
	case algorithms.KindReserve:
		r, _ = reserve(l).Allow(&algorithms.ReserveState{}, 0, 0)
	}
	return r
}

// validate checks a check's limit and cost with package algorithms.
func validate(c *store.Check) error {
	var capacity int64
	var err error
	var none *algorithms.Periods // a calendar's are valid: the limit's shape is checked
	switch c.Limit.Algorithm {
	case algorithms.KindFixedWindow:
		p := fixedWindow(c.Limit, none)
		capacity, err = p.Limit, p.Validate()
	case algorithms.KindSlidingWindow:
		p := slidingWindow(c.Limit, none)
		capacity, err = p.Limit, p.Validate()
	case algorithms.KindSlidingLog:
		p := slidingLog(c.Limit, none)
		capacity, err = p.Limit, p.Validate()
		if err == nil && p.Limit > MaxSlidingLog {
			return fmt.Errorf("sliding_log limit %d is more than the memory store keeps per key (%d)", p.Limit, MaxSlidingLog)
		}
	case algorithms.KindTokenBucket:
		p := tokenBucket(c.Limit)
		capacity, err = p.Burst, p.Validate()
	case algorithms.KindGCRA:
		p := gcra(c.Limit)
		capacity, err = p.MaxBurst+1, p.Validate()
	case algorithms.KindReserve:
		p := reserve(c.Limit)
		capacity, err = p.Burst, p.Validate()
	default:
		return fmt.Errorf("algorithm %d is unknown", c.Limit.Algorithm)
	}
	switch {
	case err != nil:
		return err
	case store.ValidCalendar(&c.Limit) != nil:
		return store.ValidCalendar(&c.Limit)
	case store.ValidOnce(c) != nil:
		return store.ValidOnce(c)
	case c.Cost < 0:
		return algorithms.ErrCostNegative
	case c.Mode > store.Refund:
		return fmt.Errorf("mode %d is unknown", c.Mode)
	case c.Mode == store.Probe && c.Cost != 0:
		return fmt.Errorf("a probe's cost must be 0 (got %d)", c.Cost)
	case c.Cost > capacity && c.Mode != store.Charge && c.Mode != store.Refund:
		return algorithms.ErrCostTooLarge
	}
	return nil
}

// The parameters (package algorithms) of a store.Limit, times in nanoseconds;
// p are the periods around the time of the decision (nil for windows of
// fixed length).

func fixedWindow(l store.Limit, p *algorithms.Periods) algorithms.FixedWindow {
	return algorithms.FixedWindow{Limit: l.Requests, Window: int64(l.Window), Aligned: true, Periods: p}
}

func slidingWindow(l store.Limit, p *algorithms.Periods) algorithms.SlidingWindow {
	return algorithms.SlidingWindow{Limit: l.Requests, Window: int64(l.Window), Periods: p}
}

func slidingLog(l store.Limit, p *algorithms.Periods) algorithms.SlidingLog {
	return algorithms.SlidingLog{Limit: l.Requests, Window: int64(l.Window), Periods: p}
}

func tokenBucket(l store.Limit) algorithms.TokenBucket {
	return algorithms.TokenBucket{Rate: l.Requests, Period: int64(l.Window), Burst: burst(l)}
}

func gcra(l store.Limit) algorithms.GCRA {
	return algorithms.GCRA{MaxBurst: burst(l) - 1, Count: l.Requests, Period: int64(l.Window)}
}

func reserve(l store.Limit) algorithms.Reserve {
	return algorithms.Reserve{Rate: l.Requests, Period: int64(l.Window), Burst: burst(l), MaxWait: int64(l.MaxWait)}
}

// burst returns l.Burst, or l.Requests when it is 0.
func burst(l store.Limit) int64 {
	if l.Burst == 0 {
		return l.Requests
	}
	return l.Burst
}
