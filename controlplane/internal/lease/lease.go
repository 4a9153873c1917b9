package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/store"
	redisstore "github.com/sluicehq/sluice/controlplane/store/redis"
)

// Defaults for Options.
const (
	DefaultTarget  = time.Second
	DefaultMax     = 1000
	DefaultLongest = time.Second
	DefaultMaxKeys = 100_000
	// forget is how long an entry with nothing leased stays after its last
	// use (it keeps the key's rate and last remaining).
	forget = 10 * time.Second
	// minLease is the smallest lease worth its call: a lease of k units
	// saves k-1 decisions, and its script call costs Redis about five
	// decisions sent in a batch (lease.lua 46 us a call against 9 us a
	// check of fcall, on a load spread over 10,000 keys). A lease of 2
	// saves one; it goes per request. (Token bucket and gcra leases last
	// half the refill of a small burst: 3 units can be all a caller
	// spends in one.)
	minLease = 3
)

// Leaser is the Redis store as the lease layer uses it.
type Leaser interface {
	store.Store
	DecideWithin(ctx context.Context, timeout time.Duration, checks []store.Check, out []algorithms.Result) error
	Lease(ctx context.Context, reqs []redisstore.LeaseRequest, out []redisstore.Lease) error
	Return(ctx context.Context, rets []redisstore.Returned) (int, error)
	Carry(ctx context.Context, carries []store.Carry) (int, error)
}

// Options configures a Store.
type Options struct {
	// Policy sizes leases; zero fields mean DefaultTarget and DefaultMax.
	Policy Policy
	// Longest bounds a lease's validity; 0 means DefaultLongest. Window
	// leases end with their window in any case.
	Longest time.Duration
	// Idle is how long a token_bucket or gcra lease may go unused before
	// its units are given back; 0 means twice Policy.Target.
	Idle time.Duration
	// Replicas returns how many control plane replicas are active (leases
	// are at most remaining / Replicas); nil means 1.
	Replicas func() int
	// MaxKeys bounds the keys with lease state; more are decided per
	// request. 0 means DefaultMaxKeys.
	MaxKeys int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Store is a store.Store that answers leased limits from leases and passes
// everything else to the Redis store. It is safe for concurrent use.
type Store struct {
	inner    Leaser
	policy   Policy
	longest  time.Duration
	idle     time.Duration
	replicas func() int
	maxKeys  int
	now      func() time.Time

	mu         sync.Mutex
	keys       map[string]*entry
	held       map[string]*entry // the entries that may hold units, for Sweep
	lastForget time.Time

	local, perRequest, calls, granted, returned, expired, shared, lateUnits atomic.Int64
	// why checks of leased limits went per request, and why Share gave
	// nothing (indexed by Unleased and Unshared)
	unleased [numUnleased]atomic.Int64
	unshared [numUnshared]atomic.Int64
	shares   atomic.Int64
}

// entry is one key's lease state.
type entry struct {
	limit     store.Limit
	units     int64     // unspent
	expiry    time.Time // the units may be spent before it (local clock)
	end       int64     // the lease's end on Redis's clock, for Return
	remaining int64     // Redis's remaining at its last answer; -1 unknown
	resetAt   time.Time // when the limiter is full again, as of that answer
	fetching  bool      // a lease call for the key is under way
	lastUse   time.Time
	rate      meter
	callers   [maxCallers]seen // the data planes Share served lately
}

var _ store.Store = (*Store)(nil)

// New returns a lease layer in front of inner.
func New(inner Leaser, opts Options) (*Store, error) {
	if inner == nil {
		return nil, errors.New("lease: inner store is nil")
	}
	if opts.Policy.Target < 0 || opts.Policy.Max < 0 || opts.Longest < 0 || opts.Idle < 0 || opts.MaxKeys < 0 {
		return nil, fmt.Errorf("lease: options must not be negative (%+v)", opts)
	}
	s := &Store{inner: inner, policy: opts.Policy, longest: opts.Longest, idle: opts.Idle,
		replicas: opts.Replicas, maxKeys: opts.MaxKeys, now: opts.Now, keys: map[string]*entry{}, held: map[string]*entry{}}
	if s.policy.Target == 0 {
		s.policy.Target = DefaultTarget
	}
	if s.policy.Max == 0 {
		s.policy.Max = DefaultMax
	}
	if s.longest == 0 {
		s.longest = DefaultLongest
	}
	if s.idle == 0 {
		s.idle = 2 * s.policy.Target
	}
	if s.replicas == nil {
		s.replicas = func() int { return 1 }
	}
	if s.maxKeys == 0 {
		s.maxKeys = DefaultMaxKeys
	}
	if s.now == nil {
		s.now = time.Now
	}
	return s, nil
}

// Name implements store.Store.
func (s *Store) Name() string { return s.inner.Name() }

// Carry passes the degrade wrapper's carries to the Redis store.
func (s *Store) Carry(ctx context.Context, carries []store.Carry) (int, error) {
	return s.inner.Carry(ctx, carries)
}

// Decide implements store.Store.
func (s *Store) Decide(ctx context.Context, checks []store.Check, out []algorithms.Result) error {
	return s.decide(ctx, 0, checks, out)
}

// DecideWithin is Decide bounded by timeout, as the Redis store's (the
// degrade wrapper calls it).
func (s *Store) DecideWithin(ctx context.Context, timeout time.Duration, checks []store.Check, out []algorithms.Result) error {
	if timeout <= 0 {
		return fmt.Errorf("lease: timeout %v is not positive", timeout)
	}
	return s.decide(ctx, timeout, checks, out)
}

// leasable reports whether c may be answered from a lease.
func leasable(c *store.Check) bool {
	return c.Cost == 1 && c.Mode == store.Take && c.Limit.Lease && redisstore.Leasable(c.Limit.Algorithm)
}

// ask is one lease to fetch for checks[i], whose key and limit it keeps
// for a late answer (the caller may reuse checks once decide returns).
type ask struct {
	i     int
	e     *entry
	key   string
	limit store.Limit
}

func (s *Store) decide(ctx context.Context, timeout time.Duration, checks []store.Check, out []algorithms.Result) error {
	if len(out) != len(checks) {
		return fmt.Errorf("lease: %d results for %d checks", len(out), len(checks))
	}
	some := false
	for i := range checks {
		if leasable(&checks[i]) {
			some = true
			break
		}
	}
	if !some { // no leased limit: the Redis store's path, untouched
		if timeout > 0 {
			return s.inner.DecideWithin(ctx, timeout, checks, out)
		}
		return s.inner.Decide(ctx, checks, out)
	}
	now := s.now()
	var rest []int
	var asks []ask
	var reqs []redisstore.LeaseRequest
	s.mu.Lock()
	for i := range checks {
		c := &checks[i]
		if !leasable(c) {
			rest = append(rest, i)
			continue
		}
		e := s.entryLocked(c.Key, c.Limit, now)
		if e == nil {
			s.unleased[UnleasedFull].Add(1)
			rest = append(rest, i)
			continue
		}
		// A lease is sized from the lesser of the key's rate before and
		// after this request: what its other requests are expected to
		// spend before the lease ends. Sized from the rate with this
		// request, two requests close together looked like a fast key
		// and leased units that mostly expired unspent (a load spread
		// over many keys, each too seldom used for leases to help).
		before := e.rate.perSecond(now)
		e.rate.add(now, 1)
		e.lastUse = now
		if e.units > 0 && !now.Before(e.expiry) {
			s.expired.Add(e.units)
			e.units = 0
		}
		if e.units > 0 {
			e.units--
			s.local.Add(1)
			out[i] = e.result(now)
			continue
		}
		pol, longest := s.policy, s.longest
		if !redisstore.Returnable(c.Limit.Algorithm) {
			// A window's lease ends with the window: size it for what is
			// left of it (on this clock, close enough to Redis's to size).
			pol.Target = min(pol.Target, windowLeft(c.Limit, now))
		} else {
			// A token bucket's lease holds back refill while it is valid,
			// so lease.lua keeps it valid for half the capacity's worth of
			// refill at most: size it to be spent in that time (what is
			// left unspent near its end goes back, Sweep), so that a
			// filter's share covers its caller until the lease ends.
			longest = min(longest, refillTime(c.Limit)/2)
			pol.Target = min(pol.Target, longest)
		}
		d := Demand{Rate: min(before, e.rate.perSecond(now)), Remaining: e.remainingAt(now), Replicas: s.replicas(), Capacity: capacity(c.Limit)}
		k := pol.Size(d)
		if k < minLease {
			k = 1
		}
		if k <= 1 || e.fetching {
			switch {
			case e.fetching:
				s.unleased[UnleasedFetching].Add(1)
			case d.Remaining < 0:
				s.unleased[UnleasedUnknown].Add(1)
			case d.Rate <= 0:
				s.unleased[UnleasedRate].Add(1)
			default:
				s.unleased[UnleasedSmall].Add(1)
			}
			rest = append(rest, i)
			continue
		}
		e.fetching = true
		asks = append(asks, ask{i: i, e: e, key: c.Key, limit: c.Limit})
		reqs = append(reqs, redisstore.LeaseRequest{Key: c.Key, Limit: c.Limit, Want: k, Longest: longest})
	}
	s.mu.Unlock()

	var f *fetch
	if len(reqs) > 0 {
		s.calls.Add(1)
		f = s.startFetch(ctx, timeout, asks, reqs, now)
	}
	var restErr error
	if len(rest) > 0 {
		s.perRequest.Add(int64(len(rest)))
		sub := make([]store.Check, len(rest))
		res := make([]algorithms.Result, len(rest))
		for j, i := range rest {
			sub[j] = checks[i]
		}
		if timeout > 0 {
			restErr = s.inner.DecideWithin(ctx, timeout, sub, res)
		} else {
			restErr = s.inner.Decide(ctx, sub, res)
		}
		if restErr == nil {
			s.mu.Lock()
			for j, i := range rest {
				out[i] = res[j]
				// Any answer of Redis tells what it has left for the key:
				// a request's, a probe's, and a refund's or a settlement's
				// (a probe after it), which gives back what leases will be
				// sized from. Units leased already stay valid: Redis
				// counted them when it granted them, and a refund gives
				// back only what Redis counted.
				if e := s.keys[checks[i].Key]; e != nil && e.limit == checks[i].Limit {
					e.remaining = res[j].Remaining
					e.resetAt = now.Add(time.Duration(res[j].ResetAfter))
				}
			}
			s.mu.Unlock()
		}
	}
	if f == nil {
		return restErr
	}
	leaseErr := s.await(f, timeout)
	if leaseErr != nil && f.abandoned {
		return errors.Join(restErr, leaseErr) // the call keeps its units when it ends
	}

	s.mu.Lock()
	for j, a := range asks {
		e := a.e
		e.fetching = false
		if leaseErr != nil {
			continue
		}
		g := f.grants[j]
		e.remaining = g.Remaining
		e.resetAt = now.Add(g.ResetAfter)
		capa := capacity(checks[a.i].Limit)
		if g.Granted == 0 {
			out[a.i] = algorithms.Result{Limit: capa, RetryAfter: int64(g.RetryAfter), ResetAfter: int64(g.ResetAfter)}
			continue
		}
		s.granted.Add(g.Granted)
		s.local.Add(1) // the request that asked spends the first unit
		if e.limit == checks[a.i].Limit {
			e.units = g.Granted - 1
			if e.units > 0 {
				s.held[checks[a.i].Key] = e
			}
			e.expiry = now.Add(g.Valid) // now was read before the call was sent: never later than Redis's end
			e.end = g.End
		} else {
			s.expired.Add(g.Granted - 1) // the limit changed meanwhile
		}
		out[a.i] = e.result(now)
		out[a.i].Limit = capa
	}
	s.mu.Unlock()
	return errors.Join(restErr, leaseErr)
}

// entryLocked returns key's entry, made or reset for l; nil when the table
// is full.
func (s *Store) entryLocked(key string, l store.Limit, now time.Time) *entry {
	e := s.keys[key]
	if e == nil {
		if len(s.keys) >= s.maxKeys {
			return nil
		}
		e = &entry{limit: l, remaining: -1}
		s.keys[key] = e
	}
	if e.limit != l {
		// A policy update changed the limit: the old lease's units are
		// lost (never spent under a limit they were not debited from).
		s.expired.Add(e.units)
		*e = entry{limit: l, remaining: -1, fetching: e.fetching}
	}
	return e
}

// remainingAt is what Redis has left for e's key at now as far as this
// replica knows: its last answer, or the capacity once that answer's reset
// time has passed (a fixed window's next window, a refilled bucket); -1
// when unknown. It only sizes leases: lease.lua grants no more than Redis
// really has.
func (e *entry) remainingAt(now time.Time) int64 {
	if e.remaining >= 0 && !e.resetAt.IsZero() && !now.Before(e.resetAt) {
		return capacity(e.limit)
	}
	return e.remaining
}

// result is an allowed request answered from e's lease.
func (e *entry) result(now time.Time) algorithms.Result {
	return algorithms.Result{Allowed: true, Limit: capacity(e.limit), Remaining: max(e.remaining, 0) + e.units,
		ResetAfter: int64(max(e.resetAt.Sub(now), 0))}
}

// windowLeft is how long the window of l that holds now has left: until
// the next multiple of the window, or the calendar period's end.
func windowLeft(l store.Limit, now time.Time) time.Duration {
	ns := now.UnixNano()
	if l.Calendar != nil {
		return time.Duration(l.Calendar.Periods(ns).End - ns)
	}
	return l.Window - time.Duration(ns%int64(l.Window))
}

// refillTime is how long a token_bucket or gcra limit l takes to refill
// from empty.
func refillTime(l store.Limit) time.Duration {
	return time.Duration(float64(l.Window) / float64(l.Requests) * float64(capacity(l)))
}

// capacity is the most a full limiter of l admits at once.
func capacity(l store.Limit) int64 {
	if (l.Algorithm == algorithms.KindTokenBucket || l.Algorithm == algorithms.KindGCRA) && l.Burst > 0 {
		return l.Burst
	}
	return l.Requests
}
