package memory

import (
	"sync/atomic"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/store"
)

// seedState is the state an entry was last seeded with (Seed) or carried
// at (Unload), in the fields its algorithm uses:
//
//	fixed_window    a: window start, b: count
//	sliding_window  a: start, b: prev, c: cur
//	sliding_log     a: newest entry, b: total
//	token_bucket    a: last, b: used
//	gcra            a: TAT
//	reserve         a: next, b: missing
type seedState struct{ a, b, c int64 }

// Seed makes the state of each check's key the one the primary's answer
// out[i] reports, so that a fallback that takes over starts from the
// primary's last word rather than a full limiter. Only answers that show
// at least half of the limiter used are kept: keys in little use cost no
// memory, and a replica that takes over such a key admits at most half a
// limit more than the primary would have. The state is derived so as
// never to admit more than the primary's state (see each case); entries
// seeded later are overwritten, what the fallback admitted meanwhile too.
// Every check's store.Once token is remembered as applied: the primary
// applied it, so a retry that this store answers charges nothing.
func (s *Store) Seed(checks []store.Check, out []algorithms.Result) {
	now := s.now().UnixNano()
	for i := range checks {
		c, r := &checks[i], &out[i]
		if c.Once != nil && store.ValidOnce(c) == nil {
			// The primary has applied it: a retry that this store
			// answers must not charge it again.
			s.once.claim(c.Key, c.Once.Token, now)
		}
		if r.Remaining*2 > r.Limit || r.ResetAfter <= 0 || validate(c) != nil {
			continue
		}
		s.shardOf(c.Key).seed(c, r, now, &s.evicted)
	}
}

// seed sets key's entry from a primary's answer r at now.
func (sh *shard) seed(c *store.Check, r *algorithms.Result, now int64, evicted *atomic.Uint64) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.m[c.Key]
	if e != nil && !e.fits(c.Limit) {
		sh.remove(e)
		e = nil
	}
	if e == nil {
		e = &entry{key: c.Key, alg: c.Limit.Algorithm}
		if e.alg == algorithms.KindSlidingLog {
			e.logCap = c.Limit.Requests
		}
		e.size = entryOverhead + int64(len(c.Key)) + e.logCap*logEntrySize
	}
	l := c.Limit
	used := r.Limit - r.Remaining
	// Only durations cross from the primary: its answer's ResetAfter, taken
	// from now on this clock (later than the primary's own now by the
	// answer's trip: the state counts that much longer, never less). The
	// primary's instants mean nothing here, whatever the skew between the
	// clocks.
	e.shift = 0
	switch l.Algorithm {
	case algorithms.KindFixedWindow, algorithms.KindSlidingWindow:
		// The entry's windows are shifted onto the primary's: the primary's
		// window (fixed_window), or its next one when the current window
		// holds requests (sliding_window: ResetAfter reaches past the
		// current window then), ends ResetAfter from now (the answer took
		// a trip to come: never earlier), at a window end here (see
		// boundaryFrom). The entry's windows are then whole and start when
		// the primary's do.
		end := now + r.ResetAfter
		e.shift = boundaryFrom(l, end) - end
		at := now + e.shift
		start, wend, next := windowsAt(l, at)
		if l.Algorithm == algorithms.KindFixedWindow {
			// Exact: the count is limit-remaining, in the window that ends
			// ResetAfter from now.
			e.fw = algorithms.FixedWindowState{Start: start, Count: used}
			e.seed = seedState{a: start, b: used}
			break
		}
		if end+e.shift == next {
			// With requests in the current window, the used estimate
			// counts as this window's: it weighs fully until the window
			// ends, where the primary's previous-window share already fades.
			e.sw = algorithms.SlidingWindowState{Start: start, Cur: used}
		} else {
			// Without, it all comes from the previous window: the largest
			// count whose weighted share now is the estimate, which fades
			// as the primary's does, and the next window is whole.
			prev := l.Requests
			if wt := (wend - at) * 1000 / (wend - start); wt > 0 { // SlidingWindow's weight at at
				prev = min(prev, used*1000/wt)
			}
			e.sw = algorithms.SlidingWindowState{Start: start, Prev: prev}
		}
		e.seed = seedState{a: e.sw.Start, b: e.sw.Prev, c: e.sw.Cur}
	case algorithms.KindSlidingLog:
		// The whole total as one entry at the newest entry's time: it
		// leaves the window no earlier than the entries it stands for.
		at := slidingLog(l, l.Periods(now)).Arrival(now + r.ResetAfter)
		e.log = slidingLog(l, nil).NewState()
		if _, err := slidingLog(l, l.Periods(at)).Allow(e.log, at, used); err != nil {
			return
		}
		e.seed = seedState{a: at, b: used}
	case algorithms.KindTokenBucket:
		// ResetAfter is ceil(used/rate): rate*ResetAfter is at least used.
		p := tokenBucket(l)
		u := p.Burst * p.Period
		if r.ResetAfter <= u/p.Rate {
			u = min(u, r.ResetAfter*p.Rate)
		}
		e.tb = algorithms.TokenBucketState{Last: now, Used: u}
		e.seed = seedState{a: now, b: u}
	case algorithms.KindGCRA:
		// Exact: ResetAfter is TAT-now.
		e.gc = algorithms.GCRAState{TAT: now + r.ResetAfter}
		e.seed = seedState{a: e.gc.TAT}
	case algorithms.KindReserve:
		// ResetAfter is what the limiter owes, in time (reserveOwed).
		e.rs = reserveFromOwed(reserve(l), r.ResetAfter, now)
		e.seed = seedState{a: e.rs.Next, b: e.rs.Missing}
	}
	e.carried = false
	e.limit = l
	e.expires = now + r.ResetAfter
	if e.prev == nil {
		sh.insert(e, evicted)
	} else {
		sh.touch(e)
	}
}

// Unload calls fn, shard by shard, with what each entry admitted beyond
// the state it was seeded with (or, once carried, since the last Unload),
// for the primary to add to its own state (see store.Carry). With drain,
// the entries are removed. Without, when fn succeeds each entry's state as
// reported becomes its seed, so the next Unload reports only what came
// after (with Base 0: the primary has the rest); when fn fails, the next
// Unload reports the same again. fn runs without the shard's lock. Unload
// stops at the first error of fn and returns it.
func (s *Store) Unload(drain bool, fn func([]store.Carry) error) error {
	var batch []store.Carry
	var done []carried
	for i := range s.shards {
		sh := &s.shards[i]
		batch, done = batch[:0], done[:0]
		// Read per shard: a Carry's durations count from this moment,
		// and the primary adds them to its own clock when fn's call
		// reaches it, shortly after.
		now := s.now().UnixNano()
		sh.mu.Lock()
		for e := sh.lru.next; e != &sh.lru; {
			next := e.next
			if c, ok := e.carry(now); ok {
				batch = append(batch, c)
			}
			if drain {
				sh.remove(e)
			} else {
				done = append(done, carried{e, e.current(now)})
			}
			e = next
		}
		sh.mu.Unlock()
		if len(batch) > 0 {
			if err := fn(batch); err != nil {
				return err
			}
		}
		if len(done) > 0 {
			sh.mu.Lock()
			for _, d := range done {
				d.e.seed, d.e.carried = d.state, true
			}
			sh.mu.Unlock()
			clear(done)
		}
	}
	return nil
}

// UnloadOnce reports to fn, in batches, the store.Once tokens this store
// remembers (those it applied, and those the primary's answers told it
// of: Seed) that no earlier UnloadOnce reported, with the time each has
// left, for the primary to remember them too (see redisstore's MarkOnce):
// a settlement the fallback applied during an outage, retried once the
// primary decides again, is then not charged a second time, and a primary
// that lost its data gets back the tokens of the charges a carry restores.
// Tokens fn refuses are reported again next time; fn's error is returned.
func (s *Store) UnloadOnce(fn func([]store.OnceMark) error) error {
	return s.once.unload(s.now().UnixNano(), onceUnloadBatch, fn)
}

// onceUnloadBatch is how many tokens one call of UnloadOnce's fn gets.
const onceUnloadBatch = 4096

// carried is an entry and the state Unload reported for it.
type carried struct {
	e     *entry
	state seedState
}

// current returns e's state at now in seedState's form.
func (e *entry) current(now int64) seedState {
	l := e.limit
	switch e.alg {
	case algorithms.KindFixedWindow:
		return seedState{a: e.fw.Start, b: e.fw.Count}
	case algorithms.KindSlidingWindow:
		st := e.sw
		// A charge of 0 rolls the state to now, in debt too (where a
		// peek, refused, would leave it as it was).
		at := now + e.shift
		_, _ = slidingWindow(l, l.Periods(at)).Charge(&st, at, 0)
		return seedState{a: st.Start, b: st.Prev, c: st.Cur}
	case algorithms.KindSlidingLog:
		_, _ = slidingLog(l, l.Periods(now)).Allow(e.log, now, 0) // prunes what left the window
		newest, ok := e.log.Newest()
		if !ok {
			return seedState{}
		}
		return seedState{a: newest, b: e.log.Total()}
	case algorithms.KindTokenBucket:
		st := e.tb
		_, _ = tokenBucket(l).Charge(&st, now, 0) // refills to now, in debt too
		return seedState{a: now, b: st.Used}
	case algorithms.KindGCRA:
		return seedState{a: e.gc.TAT}
	case algorithms.KindReserve:
		return seedState{a: e.rs.Next, b: e.rs.Missing}
	}
	return seedState{}
}

// carry returns what e holds beyond its seed at now, and whether there is
// anything to tell the primary.
func (e *entry) carry(now int64) (store.Carry, bool) {
	l := e.limit
	cur, seed := e.current(now), e.seed
	c := store.Carry{Key: e.key, Limit: l}
	// base is the seed's amount where it still counts (0 once carried:
	// the primary has it).
	base := func(v int64) int64 {
		if e.carried {
			return 0
		}
		return v
	}
	at := now + e.shift // the clock of fixed_window's and sliding_window's windows
	switch e.alg {
	case algorithms.KindFixedWindow:
		end := windowEnd(l, cur.a, at)
		if cur.b == 0 || end <= at {
			return c, false // the window is over: nothing left to count
		}
		var s int64
		if seed.a == cur.a {
			s = seed.b
		}
		c.Left, c.Base = end-at, base(s)
		c.Used = c.Base + max(0, cur.b-s)
	case algorithms.KindSlidingWindow:
		// the seed rolled to the same window as the state
		st := algorithms.SlidingWindowState{Start: seed.a, Prev: seed.b, Cur: seed.c}
		_, _ = slidingWindow(l, l.Periods(at)).Charge(&st, at, 0) // rolls in debt too
		if st.Start != cur.a {
			st = algorithms.SlidingWindowState{}
		}
		c.Left = windowEnd(l, cur.a, at) - at
		c.Base, c.BasePrev = base(st.Cur), base(st.Prev)
		c.Used = c.Base + max(0, cur.c-st.Cur)
		c.UsedPrev = c.BasePrev + max(0, cur.b-st.Prev)
		if c.Used == 0 && c.UsedPrev == 0 {
			return c, false
		}
	case algorithms.KindSlidingLog:
		if cur.b == 0 {
			return c, false
		}
		sl := slidingLog(l, l.Periods(now))
		var s int64
		if sl.Leaves(seed.a) > now {
			s = seed.b // the seeded entry is still in the window
		}
		c.Left, c.Base = sl.Leaves(cur.a)-now, base(s)
		c.Used = c.Base + max(0, cur.b-s)
	case algorithms.KindTokenBucket:
		st := algorithms.TokenBucketState{Last: seed.a, Used: seed.b}
		_, _ = tokenBucket(l).Charge(&st, now, 0) // refills in debt too
		c.Base = base(st.Used)
		c.Used = c.Base + max(0, cur.b-st.Used)
	case algorithms.KindGCRA:
		owed := func(tat int64) int64 { return max(0, tat-now) }
		c.Base = base(owed(seed.a))
		c.Used = c.Base + max(0, owed(cur.a)-owed(seed.a))
	case algorithms.KindReserve:
		p := reserve(l)
		s := reserveOwed(p, algorithms.ReserveState{Next: seed.a, Missing: seed.b}, now)
		c.Base = base(s)
		c.Used = c.Base + max(0, reserveOwed(p, algorithms.ReserveState{Next: cur.a, Missing: cur.b}, now)-s)
	}
	return c, c.Used > 0 || c.UsedPrev > 0 // UsedPrev: sliding_window's previous window
}

// boundaryFrom returns the window end of l that stands for t, a primary's
// window end on this clock: the first multiple of the window at or after
// t (windows of one length repeat: any end will do, and this one keeps the
// shift positive), or the nearest calendar boundary (calendar periods
// differ in length: the primary's is the one within the skew and the
// answer's trip, which are far shorter than a period). Added to the clock,
// its distance from t moves the windows so that one ends at t.
func boundaryFrom(l store.Limit, t int64) int64 {
	if l.Calendar != nil {
		b := l.Calendar.Boundaries(t)
		if t-b[2] <= b[3]-t {
			return b[2]
		}
		return b[3]
	}
	w := int64(l.Window)
	return t + ((-t)%w+w)%w
}

// windowsAt returns the start and end of the window of l that holds at,
// and the end of the one after it.
func windowsAt(l store.Limit, at int64) (start, end, next int64) {
	if l.Calendar != nil {
		p := l.Calendar.Periods(at)
		return p.Start, p.End, p.Next
	}
	w := int64(l.Window)
	start = at - ((at%w)+w)%w
	return start, start + w, start + 2*w
}

// windowEnd returns when the window of l that starts at start ends, as
// seen at at: a window that started before the one before at's has ended.
func windowEnd(l store.Limit, start, at int64) int64 {
	if l.Calendar == nil {
		return start + int64(l.Window)
	}
	p := l.Calendar.Periods(at)
	switch {
	case start == p.Prev:
		return p.Start
	case start == p.Start:
		return p.End
	case start == p.End:
		return p.Next
	case start < p.Prev:
		return start
	}
	return start + (p.End - p.Start) // a clock that stepped back
}

// reserveOwed returns what a reserve limiter in state st owes at now, in
// time: until its free ticket, plus the time to refill what is missing
// (rounded up). It is ResetAfter of a decision at now, and the amount
// store.Carry carries for reserve.
func reserveOwed(p algorithms.Reserve, st algorithms.ReserveState, now int64) int64 {
	next, missing := st.Next, st.Missing
	if now > next {
		if now-next > missing/p.Rate {
			missing = 0
		} else {
			missing -= (now - next) * p.Rate
		}
		next = now
	}
	return next - now + (missing+p.Rate-1)/p.Rate
}

// reserveFromOwed returns a state that owes owed at now: the store refilled
// as far as owed allows, the rest as a free ticket in the future. It never
// owes less than owed (carry.lua's carry_rs builds the same).
func reserveFromOwed(p algorithms.Reserve, owed, now int64) algorithms.ReserveState {
	capacity := p.Burst * p.Period
	if owed <= capacity/p.Rate {
		return algorithms.ReserveState{Next: now, Missing: owed * p.Rate}
	}
	full := (capacity + p.Rate - 1) / p.Rate
	return algorithms.ReserveState{Next: now + max(0, owed-full), Missing: capacity}
}
