package policystore

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/controlplane/policy"
)

// Defaults of Options.
const (
	DefaultPollInterval = time.Second
	DefaultTimeout      = 5 * time.Second
)

// MaxPolicySize is the largest policy document Apply accepts: Parse
// refuses larger ones, at start-up as on Apply.
const MaxPolicySize = policy.MaxDocumentSize

// Options configures a Store.
type Options struct {
	// Files are the policy files, which own their domains: New puts them
	// in force (PutFiles), or, when the backend cannot be read yet, serves
	// them and puts them in force once it can.
	Files []Source
	// Seed is written to the backend when the store is empty (never
	// written): start-up policies that no file owns (the embedded example,
	// or -policy-seed-only's files). A store that holds anything, even an
	// empty set after deletions, is never seeded again. Until the backend
	// can be read, the Store serves the seed (as version 0).
	Seed *policy.Set
	// PollInterval is how often the store's version is polled, so that a
	// replica that missed a change notification still converges. Default
	// DefaultPollInterval.
	PollInterval time.Duration
	// Timeout bounds each background call to the backend. Default
	// DefaultTimeout.
	Timeout time.Duration
	// Logger receives the store's logs. Default slog.Default().
	Logger *slog.Logger
	// Owner, when set, names the owner of a domain that something else
	// than this store configures (the xDS server), or returns "": Apply,
	// Delete and PutFiles refuse an owned domain with an *OwnedError (the
	// domains policy files own are refused too, without it).
	Owner func(domain string) string
}

// owned returns the *OwnedError for a change to domain by Apply or Delete
// with g, or nil: Options.Owner's domains, and the domains policy files own
// unless g.TakeOver (the backend checks these again, atomically).
func (s *Store) owned(domain string, g Guard) error {
	if s.owner != nil {
		if o := s.owner(domain); o != "" {
			return &OwnedError{Domain: domain, Owner: o}
		}
	}
	if p := s.Current().Policy(domain); p != nil && p.Owner != "" && !g.TakeOver {
		return fileOwned(domain, p.Owner)
	}
	return nil
}

// Store is the policy set of one replica, kept in step with a Backend.
type Store struct {
	b       Backend
	log     *slog.Logger
	poll    time.Duration
	timeout time.Duration
	owner   func(string) string

	refreshMu sync.Mutex  // serializes refresh
	loaded    atomic.Bool // the backend has been read at least once
	seeded    atomic.Bool // this Store wrote the seed into an empty store
	failing   bool        // the last refresh failed (under refreshMu)
	pending   []Source    // Options.Files, until put in force (under refreshMu)

	// written are the domains this replica last wrote, parsed, at the
	// version written: loading them back does not parse them again.
	written atomic.Pointer[map[string]*Policy]

	mu      sync.Mutex               // guards changed and the swap of cur
	cur     atomic.Pointer[Snapshot] // the current snapshot, never nil
	changed chan struct{}            // closed and replaced when cur changes

	stop context.CancelFunc // ends run
	done chan struct{}      // closed when run returns
}

// ApplyResult is what Apply did.
type ApplyResult struct {
	// Domain is the domain the policy names.
	Domain string
	// Version is the domain's version after the call.
	Version uint64
	// Unchanged is true when the stored policy was already byte-identical:
	// nothing was written.
	Unchanged bool
}

// New returns a Store on b and starts keeping it current. It reads the
// backend once before returning; if the store is empty it is seeded with
// opts.Seed. When the backend cannot be reached (ErrUnavailable) New still
// succeeds: the Store serves the seed and keeps trying in the background.
// Any other error (a damaged file) is returned. Close the Store when done.
func New(ctx context.Context, b Backend, opts Options) (*Store, error) {
	if b == nil {
		return nil, errors.New("policystore: New: nil backend")
	}
	s := &Store{
		b:       b,
		log:     opts.Logger,
		poll:    opts.PollInterval,
		timeout: opts.Timeout,
		owner:   opts.Owner,
		pending: opts.Files,
		changed: make(chan struct{}),
		done:    make(chan struct{}),
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.poll <= 0 {
		s.poll = DefaultPollInterval
	}
	if s.timeout <= 0 {
		s.timeout = DefaultTimeout
	}
	first, err := seedSnapshot(opts.Seed, opts.Files)
	if err != nil {
		return nil, err
	}
	s.cur.Store(first)
	initCtx, cancel := context.WithTimeout(ctx, s.timeout)
	err = s.refresh(initCtx)
	cancel()
	if err != nil {
		if !errors.Is(err, ErrUnavailable) {
			return nil, err
		}
		s.log.Warn("policy store: cannot read the store yet; serving the start-up policies until it can be read (then the policy files are put in force)",
			"backend", b.Name(), "domains", first.Set.Len(), "error", err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	s.stop = stop
	go s.run(runCtx)
	return s, nil
}

// Close stops following the backend. Current keeps returning the last
// snapshot; Next, Watch, Apply and Delete return ErrClosed.
func (s *Store) Close() {
	s.stop()
	<-s.done
}

// closed reports whether Close was called.
func (s *Store) closed() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// Ready reports whether the store has been read from the backend at least
// once (before that, the Store serves the seed).
func (s *Store) Ready() bool { return s.loaded.Load() }

// Seeded reports whether this Store wrote its seed (the start-up policies)
// into an empty store. When false after Ready, the store already held
// policies (applied earlier, or by another replica) and they are in force.
func (s *Store) Seeded() bool { return s.seeded.Load() }

// Backend returns the backend.
func (s *Store) Backend() Backend { return s.b }

// Current returns the current snapshot; never nil.
func (s *Store) Current() *Snapshot { return s.cur.Load() }

// Next returns the current snapshot as soon as it is not prev: at once when
// prev is nil or already stale, else when the next version is loaded. It
// fails when ctx ends or the Store is closed.
func (s *Store) Next(ctx context.Context, prev *Snapshot) (*Snapshot, error) {
	for {
		s.mu.Lock()
		cur, changed := s.cur.Load(), s.changed
		s.mu.Unlock()
		if cur != prev {
			return cur, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.done:
			return nil, ErrClosed
		}
	}
}

// Watch calls fn with the current snapshot and then with every new one, in
// order, from the calling goroutine, until ctx ends or the Store is closed;
// it returns why it stopped. A slow fn misses intermediate versions, never
// the latest.
func (s *Store) Watch(ctx context.Context, fn func(*Snapshot)) error {
	var snap *Snapshot
	for {
		next, err := s.Next(ctx, snap)
		if err != nil {
			return err
		}
		snap = next
		fn(snap)
	}
}

// Apply validates data as one domain's policy (source names it in error
// messages, e.g. the file it came from) and stores it if g holds. Invalid
// policies change nothing and return the policy.ErrorList naming every
// problem; a failed guard is a *ConflictError. Apply returns once this
// replica's snapshot holds the new version (or, if the store cannot be read
// back right away, once it is written).
func (s *Store) Apply(ctx context.Context, source string, data []byte, g Guard) (ApplyResult, error) {
	if s.closed() {
		return ApplyResult{}, ErrClosed
	}
	if source == "" {
		source = "request"
	}
	d, err := policy.Parse(source, data)
	if err != nil {
		return ApplyResult{}, err
	}
	if err := s.owned(d.Name, g); err != nil {
		return ApplyResult{}, err
	}
	if err := s.checkSet(source, len(data), d); err != nil {
		return ApplyResult{}, err
	}
	v, unchanged, err := s.b.Put(ctx, d.Name, data, g)
	if errors.Is(err, ErrUninitialized) {
		// The store is new or was lost: write back what this replica
		// holds first, so that the other domains survive, then retry.
		if err = s.refresh(ctx); err == nil {
			v, unchanged, err = s.b.Put(ctx, d.Name, data, g)
		}
	}
	if err != nil {
		return ApplyResult{}, err
	}
	if !unchanged {
		s.written.Store(&map[string]*Policy{d.Name: {Domain: d.Name, Version: v, YAML: data, Parsed: d}})
		s.catchUp(ctx, v)
	}
	return ApplyResult{Domain: d.Name, Version: v, Unchanged: unchanged}, nil
}

// checkSet refuses d (size bytes, named source) when the current set with
// d in place of its domain's policy would pass the set bounds (policy.
// MaxDomains, MaxSetSize, MaxDescriptors, MaxLimits): the error is a
// policy.ErrorList naming the bound. (Two replicas applying at once may
// each pass it: the set then exceeds a bound by at most their two domains.)
func (s *Store) checkSet(source string, size int, d *policy.Domain) error {
	t := tally(s.Current(), func(p *Policy) bool { return p.Domain != d.Name })
	if err := t.Add(source, int64(size), d); err != nil {
		return policy.ErrorList{err}
	}
	return nil
}

// tally counts the policies of snap that keep says stay.
func tally(snap *Snapshot, keep func(*Policy) bool) policy.SetTally {
	var t policy.SetTally
	for _, p := range snap.Policies() {
		if keep(p) {
			t.Domains++
			t.Bytes += len(p.YAML)
			t.Descriptors += p.Parsed.DescriptorCount()
			t.Limits += len(p.Parsed.Limits())
		}
	}
	return t
}

// Delete removes domain's policy if g holds and returns the new store
// version. A missing domain is ErrNotFound (wrapped), a failed guard a
// *ConflictError.
func (s *Store) Delete(ctx context.Context, domain string, g Guard) (uint64, error) {
	if s.closed() {
		return 0, ErrClosed
	}
	if err := s.owned(domain, g); err != nil {
		return 0, err
	}
	v, err := s.b.Delete(ctx, domain, g)
	if err != nil {
		return 0, err
	}
	s.catchUp(ctx, v)
	return v, nil
}

// catchUp loads the store until this replica's snapshot reaches version v
// (a write of its own), so that a caller reads its own writes here. A
// failure is logged, not returned: the write itself succeeded, and the
// background loop retries.
func (s *Store) catchUp(ctx context.Context, v uint64) {
	if s.Current().Version >= v {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if err := s.refresh(ctx); err != nil {
		s.log.Warn("policy store: written, but not read back yet; the background refresh will load it",
			"backend", s.b.Name(), "version", v, "error", err)
	}
}

// run refreshes on every hint from the backend and every poll interval.
func (s *Store) run(ctx context.Context) {
	defer close(s.done)
	hints := s.b.Subscribe(ctx)
	tick := time.NewTicker(s.poll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-hints:
			if !ok {
				hints = nil // closed: rely on polling
			}
		case <-tick.C:
		}
		rctx, cancel := context.WithTimeout(ctx, s.timeout)
		s.refresh(rctx)
		cancel()
	}
}

// refresh reads the store's version and, when it differs from the current
// snapshot's, loads and publishes the new state. An empty store (never
// written, or lost) is first given what this replica holds: the seed, or
// the last loaded set.
func (s *Store) refresh(ctx context.Context) error {
	s.refreshMu.Lock()
	defer s.refreshMu.Unlock()
	err := s.refreshLocked(ctx)
	switch {
	case err != nil && !s.failing:
		s.failing = true
		s.log.Warn("policy store: cannot read the store; keeping the current policies",
			"backend", s.b.Name(), "version", s.Current().Version, "error", err)
	case err == nil && s.failing:
		s.failing = false
		s.log.Info("policy store: reading the store again", "backend", s.b.Name(), "version", s.Current().Version)
	}
	return err
}

// refreshLocked is refresh under refreshMu. Options.Files not yet put in
// force are put in force first, so that the store's older version of them
// is never published.
func (s *Store) refreshLocked(ctx context.Context) error {
	cur := s.Current()
	v, err := s.b.Version(ctx)
	if err != nil {
		return err
	}
	if v == 0 {
		if err := s.initialize(ctx, cur); err != nil {
			return err
		}
	} else if v == cur.Version && s.loaded.Load() && s.pending == nil {
		return nil
	}
	st, err := s.b.Load(ctx)
	if err != nil {
		return err
	}
	if s.pending != nil && st.Version != 0 {
		if st, err = s.putPending(ctx, buildSnapshot(s.b.Name(), st, cur, nil, s.log)); err != nil {
			return err
		}
	}
	if st.Version == 0 || (st.Version == cur.Version && s.loaded.Load()) {
		return nil // emptied again since Init, or nothing new: the next round sees
	}
	if st.Version < cur.Version {
		s.log.Warn("policy store: the store's version went back; following the store",
			"backend", s.b.Name(), "from", cur.Version, "to", st.Version)
	}
	var written map[string]*Policy
	if w := s.written.Load(); w != nil {
		written = *w
	}
	s.publish(buildSnapshot(s.b.Name(), st, cur, written, s.log))
	s.loaded.Store(true)
	return nil
}

// initialize writes cur into an empty store.
func (s *Store) initialize(ctx context.Context, cur *Snapshot) error {
	st := cur.state()
	wrote, err := s.b.Init(ctx, st)
	if err != nil {
		return err
	}
	switch {
	case !wrote: // another replica was first
	case cur.Version > 0:
		s.log.Warn("policy store: the store was found empty (lost?); wrote back the policies this replica held",
			"backend", s.b.Name(), "version", st.Version, "domains", len(st.Records))
	default:
		s.seeded.Store(true)
		s.log.Info("policy store: initialized an empty store with the start-up policies",
			"backend", s.b.Name(), "domains", len(st.Records))
	}
	return nil
}

// publish makes snap current and wakes Next.
func (s *Store) publish(snap *Snapshot) {
	s.mu.Lock()
	s.cur.Store(snap)
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
	s.log.Info("policy store: loaded a new version", "backend", s.b.Name(), "version", snap.Version,
		"domains", snap.Set.Len())
}
