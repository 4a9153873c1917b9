package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/store"
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
	// OnceTTL is how long a store.Once token is remembered (its dedupe
	// key's PX), at least a millisecond; 0 means DefaultOnceTTL.
	OnceTTL time.Duration
}

// DefaultOnceTTL is Options.OnceTTL's default.
const DefaultOnceTTL = 15 * time.Minute

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
	onceTTL     int64 // milliseconds

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
	if opts.OnceTTL < 0 || (opts.OnceTTL > 0 && opts.OnceTTL < time.Millisecond) {
		return nil, fmt.Errorf("redisstore: OnceTTL %v is below a millisecond", opts.OnceTTL)
	}
	s := &Store{client: client, maxBatch: opts.MaxBatch, maxInFlight: opts.MaxInFlight, now: opts.Now,
		noFunctions: opts.NoFunctions, roundTrip: opts.RoundTrip, onceTTL: opts.OnceTTL.Milliseconds()}
	if s.onceTTL == 0 {
		s.onceTTL = DefaultOnceTTL.Milliseconds()
	}
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
	var now int64 // this clock, read for calendar limits only
	for i, ch := range checks {
		if ch.Limit.Calendar != nil && now == 0 {
			now = s.clock()
		}
		w, err := encode(ch, now)
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

// clock returns this replica's time (Unix nanoseconds): the injected one
// in tests. The scripts' clock is Redis's; this one only picks the calendar
// periods to send (see encode).
func (s *Store) clock() int64 {
	if s.now != nil {
		return s.now().UnixNano()
	}
	return time.Now().UnixNano()
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
