// Package redisstore is sluice's authoritative store: rate-limit state in
// Redis (standalone, Sentinel or Cluster, through a go-redis UniversalClient),
// decided by Lua ports of shared/algorithms.
//
// # Scripts
//
// One .lua file per algorithm (fixed_window is clock-aligned, as in
// envoyproxy/ratelimit) sits beside this file; each is a line-by-line port of
// its Go counterpart on microseconds, Redis's TIME unit, with the same integer
// arithmetic. Lua numbers are doubles, exact for integers below 2^53, so
// Decide refuses limits whose intermediate values could leave that range (see
// luaBounds). The files are joined into one script that decides every key of
// a call, so one script call answers a whole request, or many concurrent
// requests. On Redis 7 and later the same parts are loaded once as a function
// library and called with FCALL; EVALSHA is the fallback (see
// Options.NoFunctions), and RATIONALE.md says why.
// The clock is Redis TIME, read once per script call; Options.Now injects a
// time instead, for tests. Every written key gets a PEXPIRE at the moment its
// state would be back to "fresh" anyway (ceil of the reset time in
// milliseconds, plus one), so idle keys vanish; the logic never depends on it.
// (fixed_window keeps the expiry its window's first write set: see
// fixed_window.lua.) A denied request takes nothing and leaves the state as
// it was: it writes nothing, except that fixed_window counts first and takes
// the cost back in the same script call, and sliding_log drops entries that
// have left the window, as its Go counterpart does. A server that lost the
// script (SCRIPT FLUSH, restart, failover) answers NOSCRIPT, or for the
// library "Function not found", and the call is repeated once with EVAL,
// which loads the script (and the library is loaded again). Redis 5 or newer
// (the scripts write after reading TIME, which needs effect replication).
//
// # Units
//
// Results come back in nanoseconds (microseconds times 1000). Against the
// nanosecond Go algorithms on the same whole-microsecond inputs: fixed_window
// and sliding_log give identical results; token_bucket and sliding_window
// identical Allowed and Remaining, and durations that are the Go ones rounded
// up to a whole microsecond; gcra rounds its emission interval (period/count)
// down to a whole microsecond, where Go in nanoseconds rounds it down to a
// nanosecond, so the two agree exactly only when the period in microseconds
// is a multiple of count. TestRoundingRule checks all of this.
//
// # Round trips and batching
//
// Decide calls that arrive while MaxInFlight script round trips are under way
// queue, and are sent together, up to MaxBatch checks per script call, as
// soon as one round trip ends: under light load a call goes out at once, under
// heavy load the script's fixed cost (10-20 us of Redis CPU) is shared. On
// a standalone or Sentinel client one script call takes keys of any slot. On
// a Cluster (or Ring) client, a script call may only touch one hash slot, so
// checks are grouped by their keys' hash tags (store.Key puts each limit's
// hash in one) and the group's script calls are pipelined: one round trip per
// node.
//
// The script calls are marked as not retryable: a script that ran but whose
// reply was lost must not run again, or it would count twice. go-redis still
// retries what cannot have run (dial errors, MOVED, ASK).
//
// # Deadlines
//
// Decide returns when ctx is done, whatever the round trip is doing. The
// round trip itself ends on go-redis's read and write timeouts, or on the
// latest deadline of the calls it carries when the client has
// ContextTimeoutEnabled; set that and a ReadTimeout near the decision
// deadline so that a stalled server frees its round trips quickly.
package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/controlplane/store"
	"github.com/sluicehq/sluice/shared/algorithms"
)

// Defaults for Options.
const (
	DefaultMaxBatch    = 256 // checks per script call
	DefaultMaxInFlight = 2   // script round trips under way at once
)

// Options tunes a Store. The zero value is ready for production.
type Options struct {
	// MaxBatch is the most checks one script call decides; 0 means
	// DefaultMaxBatch. Queued Decide calls are combined up to it; a single
	// call with more checks is split into several script calls sent in one
	// round trip.
	MaxBatch int
	// MaxInFlight is the most script round trips under way at once; 0 means
	// DefaultMaxInFlight. Calls that arrive while all are busy wait and
	// leave together when one ends.
	MaxInFlight int
	// Now, for tests only, replaces the script's clock (Redis TIME): each
	// script call passes Now() to the script, in whole microseconds, and the
	// script then adds a day to every expiry so that wall-clock expiry cannot
	// overtake the injected clock. Production leaves it nil.
	Now func() time.Time
	// NoFunctions makes every script call an EVALSHA. By default the store
	// loads the scripts as a function library (FUNCTION LOAD, Redis 7 and
	// later, on every master) and calls it with FCALL, which spares Redis
	// running the script's whole chunk on every call; it falls back to
	// EVALSHA while the library is not loaded, and where FUNCTION LOAD fails
	// (older Redis, or an ACL that forbids it) it tries again once a minute.
	// Set NoFunctions when the Redis user must not run FUNCTION LOAD.
	NoFunctions bool
	// RoundTrip, when set, is told how long each script round trip took
	// (every script call of one batch, and their EVAL retries), for a
	// latency histogram.
	RoundTrip func(time.Duration)
}

// loadRetry is how long the store waits after a failed FUNCTION LOAD before
// it tries again.
const loadRetry = time.Minute

// Store decides checks in Redis. It implements store.Store and is safe for
// concurrent use. It does not own the client: closing the client is the
// caller's business, after the last Decide has returned.
type Store struct {
	client      redis.UniversalClient
	single      bool // one server holds every key (standalone or Sentinel)
	maxBatch    int
	maxInFlight int
	now         func() time.Time // nil: Redis TIME
	noFunctions bool
	roundTrip   func(time.Duration)

	functions atomic.Bool  // the library is loaded: script calls are FCALLs
	loading   atomic.Bool  // a FUNCTION LOAD is under way
	failedAt  atomic.Int64 // when the last FUNCTION LOAD failed (Unix ns); 0: try at once

	mu       sync.Mutex
	queue    []*call // calls waiting for a round trip, oldest first
	inFlight int     // round trips under way
}

var _ store.Store = (*Store)(nil)

// New returns a Store that keeps its state through client: a *redis.Client
// (standalone, or Sentinel from redis.NewFailoverClient) or a
// *redis.ClusterClient, as redis.NewUniversalClient makes them.
func New(client redis.UniversalClient, opts Options) (*Store, error) {
	if client == nil {
		return nil, errors.New("redisstore: client is nil")
	}
	if opts.MaxBatch < 0 {
		return nil, fmt.Errorf("redisstore: MaxBatch %d is negative", opts.MaxBatch)
	}
	if opts.MaxInFlight < 0 {
		return nil, fmt.Errorf("redisstore: MaxInFlight %d is negative", opts.MaxInFlight)
	}
	s := &Store{client: client, maxBatch: opts.MaxBatch, maxInFlight: opts.MaxInFlight, now: opts.Now,
		noFunctions: opts.NoFunctions, roundTrip: opts.RoundTrip}
	if s.maxBatch == 0 {
		s.maxBatch = DefaultMaxBatch
	}
	if s.maxInFlight == 0 {
		s.maxInFlight = DefaultMaxInFlight
	}
	_, s.single = client.(*redis.Client)
	return s, nil
}

// Functions reports whether script calls are FCALLs of the loaded function
// library (see Options.NoFunctions); false while they are EVALSHAs.
func (s *Store) Functions() bool { return s.functions.Load() }

// Name implements store.Store.
func (s *Store) Name() string { return "redis" }

// Call states: who gets to touch the call's out slice.
const (
	pending    int32 = iota // queued or in a round trip
	abandoned               // the caller returned on ctx; nothing may be written
	delivering              // a round trip writes the results
)

// call is one Decide waiting for its results.
type call struct {
	wires    []wire
	out      []algorithms.Result
	deadline time.Time // zero: none
	state    atomic.Int32
	claimed  bool  // the round trip won the right to deliver (set by it only)
	err      error // read by the caller after done is closed
	done     chan struct{}
}

// Decide implements store.Store: every check in one script round trip (one
// per node on a Cluster), possibly shared with concurrent calls. A check
// whose limit the scripts cannot decide fails the call with an error that
// wraps store.ErrInvalidLimit and the *algorithms.LimitError naming the field.
func (s *Store) Decide(ctx context.Context, checks []store.Check, out []algorithms.Result) error {
	return s.decide(ctx, 0, checks, out)
}

// DecideWithin is Decide bounded also by timeout: a call not decided within
// timeout returns an error wrapping context.DeadlineExceeded (and, like a
// call whose ctx ends, is not sent if it is still queued). It does what a
// context.WithTimeout around Decide would, for less: a pooled timer, and
// nothing registered with ctx. The degrade wrapper bounds every decision
// this way.
func (s *Store) DecideWithin(ctx context.Context, timeout time.Duration, checks []store.Check, out []algorithms.Result) error {
	if timeout <= 0 {
		return fmt.Errorf("redisstore: timeout %v is not positive", timeout)
	}
	return s.decide(ctx, timeout, checks, out)
}

// decide is Decide, bounded by timeout when it is positive.
func (s *Store) decide(ctx context.Context, timeout time.Duration, checks []store.Check, out []algorithms.Result) error {
	if len(out) != len(checks) {
		return fmt.Errorf("redisstore: %d results for %d checks", len(out), len(checks))
	}
	if len(checks) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("redisstore: %w", err)
	}
	c := &call{wires: make([]wire, len(checks)), out: out, done: make(chan struct{})}
	for i, ch := range checks {
		w, err := encode(ch)
		if err != nil {
			return fmt.Errorf("redisstore: check %d (%s): %w: %w", i, ch.Limit.Algorithm, store.ErrInvalidLimit, err)
		}
		c.wires[i] = w
	}
	if d, ok := ctx.Deadline(); ok {
		c.deadline = d
	}
	var expire <-chan time.Time
	if timeout > 0 {
		if d := time.Now().Add(timeout); c.deadline.IsZero() || d.Before(c.deadline) {
			c.deadline = d
		}
		t := timers.Get().(*time.Timer)
		t.Reset(timeout)
		defer func() { t.Stop(); timers.Put(t) }()
		expire = t.C
	}
	s.submit(c)
	var cause error
	select {
	case <-c.done:
		return c.err
	case <-ctx.Done():
		cause = ctx.Err()
	case <-expire:
		cause = fmt.Errorf("%w: not decided within %v", context.DeadlineExceeded, timeout)
	}
	if c.state.CompareAndSwap(pending, abandoned) {
		return fmt.Errorf("redisstore: %w", cause)
	}
	<-c.done // the results are being written right now
	return c.err
}

// timers are stopped timers for DecideWithin (since Go 1.23 a stopped or
// reset timer delivers no stale value).
var timers = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}}

// submit starts a round trip for c if one may start, else queues c for the
// next round trip to end.
func (s *Store) submit(c *call) {
	s.mu.Lock()
	if s.inFlight < s.maxInFlight {
		s.inFlight++
		s.mu.Unlock()
		go s.sendLoop([]*call{c})
		return
	}
	s.queue = append(s.queue, c)
	s.mu.Unlock()
}

// sendLoop sends batch and then, keeping its round-trip slot, whatever queued
// meanwhile, until the queue is empty.
func (s *Store) sendLoop(batch []*call) {
	for {
		s.send(batch)
		s.mu.Lock()
		batch = s.take()
		if len(batch) == 0 {
			s.inFlight--
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
	}
}

// take removes the oldest queued calls, up to maxBatch checks (at least one
// call), dropping calls whose callers have gone. s.mu must be held.
func (s *Store) take() []*call {
	var batch []*call
	n, i := 0, 0
	for ; i < len(s.queue); i++ {
		c := s.queue[i]
		if c.state.Load() == abandoned {
			continue
		}
		if len(batch) > 0 && n+len(c.wires) > s.maxBatch {
			break
		}
		batch = append(batch, c)
		n += len(c.wires)
	}
	rest := copy(s.queue, s.queue[i:])
	clear(s.queue[rest:])
	s.queue = s.queue[:rest]
	return batch
}

// ref locates one check: call c's check i.
type ref struct {
	c *call
	i int
}

// scriptCmd is one script call: an EVALSHA (or, after NOSCRIPT, an EVAL) and
// the checks it decides, in KEYS order.
type scriptCmd struct {
	cmd  *redis.IntSliceCmd // the reply is integers only: read without boxing
	args []any
	refs []ref
}

// noRetry makes go-redis leave a script call alone once it may have run: a
// lost reply must not count the request twice.
type noRetry struct{ *redis.IntSliceCmd }

// NoRetry implements redis.Cmder.
func (noRetry) NoRetry() bool { return true }

// send decides every check of batch and delivers the results.
func (s *Store) send(batch []*call) {
	ctx, cancel := batchContext(batch)
	defer cancel()
	var now any = ""
	if s.now != nil {
		us := s.now().UnixMicro()
		if us < 0 || us >= maxNow {
			s.deliver(batch, nil, fmt.Errorf("redisstore: injected time %d us is outside [0, 2^52)", us))
			return
		}
		now = us
	}
	functions := s.functions.Load()
	if !functions {
		s.loadLater()
	}
	cmds := s.build(ctx, batch, now, functions)
	if s.roundTrip != nil {
		defer func(start time.Time) { s.roundTrip(time.Since(start)) }(time.Now())
	}
	s.run(ctx, cmds)
	var lost []*scriptCmd
	for _, sc := range cmds {
		err := sc.cmd.Err()
		if isNoFunction(err) {
			// FUNCTION FLUSH, or a node that never had it: load it again
			s.functions.Store(false)
			s.failedAt.Store(0)
		}
		if isNoScript(err) || isNoFunction(err) {
			sc.args[0], sc.args[1] = "eval", scriptSource
			sc.cmd = newCmd(ctx, sc.args)
			lost = append(lost, sc)
		}
	}
	if len(lost) > 0 {
		s.run(ctx, lost)
	}
	s.deliver(batch, cmds, nil)
}

// batchContext returns the context of a round trip: the latest deadline of
// its calls, none if one of them has none. No single caller may cancel it,
// since the round trip serves them all.
func batchContext(batch []*call) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, c := range batch {
		if c.deadline.IsZero() {
			return context.Background(), func() {}
		}
		if c.deadline.After(latest) {
			latest = c.deadline
		}
	}
	return context.WithDeadline(context.Background(), latest)
}

// build groups the checks of batch into script calls: all together on a
// single server, by hash tag elsewhere; at most maxBatch checks each.
func (s *Store) build(ctx context.Context, batch []*call, now any, functions bool) []*scriptCmd {
	var groups [][]ref
	if s.single {
		var all []ref
		for _, c := range batch {
			for i := range c.wires {
				all = append(all, ref{c, i})
			}
		}
		groups = append(groups, all)
	} else {
		index := map[string]int{}
		for _, c := range batch {
			for i, w := range c.wires {
				tag := hashTag(w.key)
				g, ok := index[tag]
				if !ok {
					g = len(groups)
					index[tag] = g
					groups = append(groups, nil)
				}
				groups[g] = append(groups[g], ref{c, i})
			}
		}
	}
	var cmds []*scriptCmd
	for _, g := range groups {
		for len(g) > 0 {
			n := min(len(g), s.maxBatch)
			cmds = append(cmds, newScriptCmd(ctx, g[:n], now, functions))
			g = g[n:]
		}
	}
	return cmds
}

// newScriptCmd returns the FCALL (with functions) or EVALSHA that decides
// refs (see dispatch.lua for the arguments).
func newScriptCmd(ctx context.Context, refs []ref, now any, functions bool) *scriptCmd {
	// The distinct limits, numbered from 1 in order of first use; a call
	// rarely holds more than a few, so a linear search beats a map.
	var lims []params
	nums := make([]int, len(refs))
	for k, r := range refs {
		p := r.c.wires[r.i].lim
		n := slices.Index(lims, p)
		if n < 0 {
			n = len(lims)
			lims = append(lims, p)
		}
		nums[k] = n + 1
	}
	args := make([]any, 0, 5+len(refs)*(1+argsPerCheck)+len(lims)*argsPerLimit)
	if functions {
		args = append(args, "fcall", libraryName, len(refs))
	} else {
		args = append(args, "evalsha", scriptSHA, len(refs))
	}
	for _, r := range refs {
		args = append(args, r.c.wires[r.i].key)
	}
	args = append(args, now, len(lims))
	for _, p := range lims {
		args = append(args, p.alg, p.p1, p.p2, p.p3, p.p4)
	}
	if uniform(refs, nums) {
		args = append(args, nums[0], refs[0].c.wires[refs[0].i].cost)
	} else {
		for k, r := range refs {
			args = append(args, nums[k], r.c.wires[r.i].cost)
		}
	}
	return &scriptCmd{cmd: newCmd(ctx, args), args: args, refs: refs}
}

// uniform reports whether every check of refs has the same limit (nums) and
// cost: the script then takes that pair once (see dispatch.lua).
func uniform(refs []ref, nums []int) bool {
	cost := refs[0].c.wires[refs[0].i].cost
	for k, r := range refs {
		if nums[k] != nums[0] || r.c.wires[r.i].cost != cost {
			return false
		}
	}
	return true
}

// newCmd returns a command whose first key is its fourth argument, as in
// EVAL and EVALSHA (Cluster routing reads it).
func newCmd(ctx context.Context, args []any) *redis.IntSliceCmd {
	cmd := redis.NewIntSliceCmd(ctx, args...)
	cmd.SetFirstKeyPos(3)
	return cmd
}

// run sends cmds in one round trip (one per node on a Cluster). Errors stay
// on the commands.
func (s *Store) run(ctx context.Context, cmds []*scriptCmd) {
	if len(cmds) == 1 {
		_ = s.client.Process(ctx, noRetry{cmds[0].cmd})
		return
	}
	pipe := s.client.Pipeline()
	for _, sc := range cmds {
		_ = pipe.Process(ctx, noRetry{sc.cmd})
	}
	_, _ = pipe.Exec(ctx)
}

// isNoScript reports whether err says the server does not have the script.
func isNoScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}

// isNoFunction reports the error FCALL answers for a function the server
// does not have.
func isNoFunction(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "ERR Function not found")
}

// loadLater starts loading the function library unless that is under way,
// not wanted, or failed less than loadRetry ago. Script calls use EVALSHA
// meanwhile.
func (s *Store) loadLater() {
	if s.noFunctions {
		return
	}
	if at := s.failedAt.Load(); at != 0 && time.Since(time.Unix(0, at)) < loadRetry {
		return
	}
	if !s.loading.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer s.loading.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.loadFunctions(ctx); err != nil {
			s.failedAt.Store(time.Now().UnixNano())
		}
	}()
}

// loadFunctions loads the function library on every master and, when all
// have it, makes script calls FCALLs.
func (s *Store) loadFunctions(ctx context.Context) error {
	load := func(ctx context.Context, c *redis.Client) error {
		err := c.FunctionLoad(ctx, librarySource).Err()
		if err != nil && strings.Contains(err.Error(), "already exists") {
			return nil // this version's, loaded by another instance
		}
		return err
	}
	var err error
	switch c := s.client.(type) {
	case *redis.Client:
		err = load(ctx, c)
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, load)
	case *redis.Ring:
		err = c.ForEachShard(ctx, load)
	default:
		err = fmt.Errorf("redisstore: cannot load functions through a %T", s.client)
	}
	if err != nil {
		return err
	}
	s.functions.Store(true)
	return nil
}

// deliver hands every call of batch its results, or its error: failed, if
// not nil, fails them all.
func (s *Store) deliver(batch []*call, cmds []*scriptCmd, failed error) {
	for _, c := range batch {
		c.claimed = c.state.CompareAndSwap(pending, delivering)
		if c.claimed && failed != nil {
			c.err = failed
		}
	}
	for _, sc := range cmds {
		decode(sc)
	}
	for _, c := range batch {
		if c.claimed {
			close(c.done)
		}
	}
}

// decode writes one script call's results into its claimed calls' out
// slices, or their errors. The reply's layout is in dispatch.lua.
func decode(sc *scriptCmd) {
	vals, err := sc.cmd.Result()
	if err == nil {
		err = checkReply(vals, len(sc.refs))
	}
	for k, r := range sc.refs {
		c := r.c
		if !c.claimed || c.err != nil {
			continue
		}
		if err != nil {
			c.err = fmt.Errorf("redisstore: %s: %w", sc.args[0], err)
			continue
		}
		w := &c.wires[r.i]
		v := vals[1+k]
		if v >= 0 {
			c.out[r.i] = algorithms.Result{
				Allowed:    true,
				Limit:      w.limit,
				Remaining:  v,
				ResetAfter: vals[0] * int64(time.Microsecond),
			}
			continue
		}
		long := vals[1+len(sc.refs)+longAnswer*int(-v-1):]
		switch long[0] {
		case 0, 1:
			c.out[r.i] = algorithms.Result{
				Allowed:    long[0] == 1,
				Limit:      w.limit,
				Remaining:  long[1],
				RetryAfter: long[2] * int64(time.Microsecond),
				ResetAfter: long[3] * int64(time.Microsecond),
			}
			if w.lim.alg%modeScale == algReserve { // the third value is an allowed request's wait (reserve.lua)
				res := &c.out[r.i]
				if res.Allowed {
					res.Wait, res.RetryAfter = res.RetryAfter, 0
				} else {
					res.Wait = res.RetryAfter + w.lim.p4*int64(time.Microsecond)
				}
			}
		case badState:
			c.err = fmt.Errorf("redisstore: key %.80q holds a value sluice did not write (wrong type or unparsable state); delete it to reset the limit", w.key)
		default:
			c.err = fmt.Errorf("redisstore: script answered allowed=%d for key %.80q", long[0], w.key)
		}
	}
}

// checkReply reports a script reply for checks checks that does not have
// dispatch.lua's layout: every long answer pointed at must be there, and
// nothing else.
func checkReply(vals []int64, checks int) error {
	if len(vals) < 1+checks || (len(vals)-1-checks)%longAnswer != 0 {
		return fmt.Errorf("script answered %d integers for %d checks", len(vals), checks)
	}
	longs := (len(vals) - 1 - checks) / longAnswer
	for _, v := range vals[1 : 1+checks] {
		if v < -int64(longs) {
			return fmt.Errorf("script answered a long answer %d of %d", -v, longs)
		}
	}
	return nil
}

// hashTag returns the part of key Redis Cluster hashes: the text between the
// first '{' and the next '}' if that is not empty, else the whole key.
func hashTag(key string) string {
	for i := 0; i < len(key); i++ {
		if key[i] == '{' {
			for j := i + 1; j < len(key); j++ {
				if key[j] == '}' {
					if j > i+1 {
						return key[i+1 : j]
					}
					return key
				}
			}
			return key
		}
	}
	return key
}
