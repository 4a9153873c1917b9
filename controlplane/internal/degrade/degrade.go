package degrade

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/store"
)

// Defaults for Options.
const (
	DefaultDeadline      = 20 * time.Millisecond
	DefaultProbeInterval = 200 * time.Millisecond
)

// ErrDeadline is returned (wrapped) by the primary attempt when the primary
// did not answer within the deadline; it is counted, never returned by
// Decide unless the fallback fails too.
var ErrDeadline = errors.New("degrade: primary missed the deadline")

// Options configures a Store.
type Options struct {
	// Probe checks whether the primary answers again (for Redis: PING). It
	// is required. It is called with a context bounded by ProbeTimeout.
	Probe func(ctx context.Context) error
	// Deadline bounds each decision on the primary; 0 means DefaultDeadline.
	Deadline time.Duration
	// ProbeInterval is the time between probes while degraded; 0 means
	// DefaultProbeInterval.
	ProbeInterval time.Duration
	// ProbeTimeout bounds one probe; 0 means ProbeInterval.
	ProbeTimeout time.Duration
	// TrustContext says the primary's Decide returns promptly once its
	// context ends, as the Redis store's does. The primary is then called
	// directly: through its DecideWithin method if it has one (as the
	// Redis store does: cheaper than a context per decision), else with a
	// deadline context. Otherwise each attempt runs in its own goroutine on
	// copies of the checks, so that even a primary that ignores its context
	// cannot hold a decision past the deadline.
	TrustContext bool
	// OnChange, if set, is called after each switch with the new state
	// (true: degraded). It must not block; calls are not ordered across
	// concurrent switches, so read Degraded for the current state.
	OnChange func(degraded bool)
	// Logger receives one line per switch; nil means slog.Default().
	Logger *slog.Logger
	// Registerer registers the metrics (see NewMetrics); nil means they are
	// kept but not registered.
	Registerer prometheus.Registerer
	// Trip says which failures switch to the fallback; the zero value
	// means the defaults (see Trip).
	Trip Trip
	// Now is the clock the Trip rules count on; nil means time.Now.
	// (Deadlines are real timers either way.)
	Now func() time.Time
}

// Store is a store.Store that decides on a primary and falls back to a
// second store while the primary fails. It is safe for concurrent use.
type Store struct {
	primary, fallback store.Store
	probe             func(context.Context) error
	deadline          time.Duration
	probeInterval     time.Duration
	probeTimeout      time.Duration
	log               *slog.Logger
	metrics           *Metrics
	onChange          func(bool)
	trustContext      bool
	trip              *tripper
	now               func() time.Time
	seeder            seeder   // nil: the fallback starts from nothing
	unloader          unloader // with carrier: outage counts go back to the primary
	carrier           carrier
	onceUnloader      onceUnloader // with marker: settlement tokens go back to the primary
	marker            onceMarker
	noSeed            atomic.Bool // while degraded or carrying: the fallback's state must stay

	degraded atomic.Bool
	calls    sync.Pool // *call

	mu      sync.Mutex // guards probing and closed
	probing bool       // a prober goroutine is running
	closed  bool
	stop    chan struct{} // closed by Close
	wg      sync.WaitGroup
}

// Metrics are the Store's Prometheus collectors.
type Metrics struct {
	// Degraded is 1 while decisions come from the fallback.
	Degraded prometheus.Gauge
	// DegradedDecisions counts Decide calls answered by the fallback.
	DegradedDecisions prometheus.Counter
	// Transitions counts switches, labelled to="fallback" or to="primary".
	Transitions *prometheus.CounterVec
	// PrimaryFailures counts failed primary attempts, labelled
	// reason="error" or reason="deadline".
	PrimaryFailures *prometheus.CounterVec
	// ProbeFailures counts failed probes.
	ProbeFailures prometheus.Counter
	// Carried counts the keys whose outage counts were carried to the
	// primary on the way back.
	Carried prometheus.Counter
}

// NewMetrics returns the collectors, registered with reg unless reg is nil.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Degraded: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_store_degraded",
			Help: "1 while decisions are answered by the fallback (memory) store because the primary (Redis) fails.",
		}),
		DegradedDecisions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_store_degraded_decisions_total",
			Help: "Store calls answered by the fallback (memory) store.",
		}),
		Transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_store_degrade_transitions_total",
			Help: "Switches between the primary and the fallback store, by destination.",
		}, []string{"to"}),
		PrimaryFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_store_primary_failures_total",
			Help: "Primary store calls that failed (reason=error) or missed the deadline (reason=deadline).",
		}, []string{"reason"}),
		ProbeFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_store_probe_failures_total",
			Help: "Health probes of the primary store that failed while degraded.",
		}),
		Carried: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_store_carried_keys_total",
			Help: "Keys whose counts from the fallback (memory) store were added to the primary (Redis) on returning to it.",
		}),
	}
	for _, to := range []string{"fallback", "primary"} {
		m.Transitions.WithLabelValues(to)
	}
	for _, r := range []string{"error", "deadline"} {
		m.PrimaryFailures.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.Degraded, m.DegradedDecisions, m.Transitions, m.PrimaryFailures, m.ProbeFailures, m.Carried)
	}
	return m
}

// New returns a Store deciding on primary, falling back to fallback.
func New(primary, fallback store.Store, opts Options) (*Store, error) {
	switch {
	case primary == nil:
		return nil, errors.New("degrade: primary store is nil")
	case fallback == nil:
		return nil, errors.New("degrade: fallback store is nil")
	case opts.Probe == nil:
		return nil, errors.New("degrade: Options.Probe is required (it tells when the primary is back)")
	case opts.Deadline < 0:
		return nil, fmt.Errorf("degrade: Options.Deadline must not be negative (got %v)", opts.Deadline)
	case opts.ProbeInterval < 0:
		return nil, fmt.Errorf("degrade: Options.ProbeInterval must not be negative (got %v)", opts.ProbeInterval)
	case opts.ProbeTimeout < 0:
		return nil, fmt.Errorf("degrade: Options.ProbeTimeout must not be negative (got %v)", opts.ProbeTimeout)
	}
	trip, err := opts.Trip.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Store{
		primary:       primary,
		fallback:      fallback,
		probe:         opts.Probe,
		deadline:      opts.Deadline,
		probeInterval: opts.ProbeInterval,
		probeTimeout:  opts.ProbeTimeout,
		log:           opts.Logger,
		metrics:       NewMetrics(opts.Registerer),
		onChange:      opts.OnChange,
		trustContext:  opts.TrustContext,
		trip:          newTripper(trip),
		now:           opts.Now,
		stop:          make(chan struct{}),
	}
	if s.now == nil {
		s.now = time.Now
	}
	s.seeder, _ = fallback.(seeder)
	s.unloader, _ = fallback.(unloader)
	s.carrier, _ = primary.(carrier)
	s.onceUnloader, _ = fallback.(onceUnloader)
	s.marker, _ = primary.(onceMarker)
	if s.deadline == 0 {
		s.deadline = DefaultDeadline
	}
	if s.probeInterval == 0 {
		s.probeInterval = DefaultProbeInterval
	}
	if s.probeTimeout == 0 {
		s.probeTimeout = s.probeInterval
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	s.calls.New = func() any { return &call{done: make(chan error, 1)} }
	return s, nil
}

// Name returns "primary|fallback", e.g. "redis|memory".
func (s *Store) Name() string { return s.primary.Name() + "|" + s.fallback.Name() }

// Degraded reports whether decisions currently come from the fallback.
func (s *Store) Degraded() bool { return s.degraded.Load() }

// Metrics returns the Store's collectors.
func (s *Store) Metrics() *Metrics { return s.metrics }

// Decide implements store.Store: the primary within the deadline, else the
// fallback (switching to it for later calls too when the failure is
// sustained, see Trip). An error means both failed (or ctx ended, or a check is invalid:
// an error wrapping store.ErrInvalidLimit does not degrade the Store, since
// the fallback would refuse the check too).
func (s *Store) Decide(ctx context.Context, checks []store.Check, out []algorithms.Result) error {
	if len(out) != len(checks) {
		return fmt.Errorf("degrade: %d results for %d checks", len(out), len(checks))
	}
	if !s.degraded.Load() {
		start := s.now()
		err := s.tryPrimary(ctx, checks, out)
		if err == nil {
			s.trip.success(start)
			if s.seeder != nil && !s.noSeed.Load() {
				s.seeder.Seed(checks, out)
			}
			return nil
		}
		if ctxErr := ctx.Err(); ctxErr != nil {
			return ctxErr // the caller gave up: not the primary's fault
		}
		if errors.Is(err, store.ErrInvalidLimit) {
			return err
		}
		reason := "error"
		if errors.Is(err, ErrDeadline) {
			reason = "deadline"
		}
		s.metrics.PrimaryFailures.WithLabelValues(reason).Inc()
		if s.trip.failure(start, s.now()) {
			s.enterDegraded(err)
		}
	}
	s.metrics.DegradedDecisions.Inc()
	if err := s.fallback.Decide(ctx, checks, out); err != nil {
		return fmt.Errorf("degrade: primary %s unavailable and fallback %s failed: %w", s.primary.Name(), s.fallback.Name(), err)
	}
	return nil
}

// call is one primary attempt. Its own copies of the checks and results let
// an attempt that missed the deadline finish in the background without
// touching the caller's slices.
type call struct {
	checks []store.Check
	onces  []store.Once // the checks' Once, which the primary writes
	out    []algorithms.Result
	done   chan error // buffered: the attempt never blocks on send
}

// ownOnces points the Once of c's checks at c's own copies, so that an
// attempt left running past the deadline writes nothing of the caller's.
func (c *call) ownOnces() {
	n := 0
	for k := range c.checks {
		if c.checks[k].Once != nil {
			n++
		}
	}
	if n == 0 {
		return
	}
	if cap(c.onces) < n {
		c.onces = make([]store.Once, 0, n)
	}
	c.onces = c.onces[:0]
	for k := range c.checks {
		if o := c.checks[k].Once; o != nil {
			c.onces = append(c.onces, *o)
			c.checks[k].Once = &c.onces[len(c.onces)-1]
		}
	}
}

// withinDecider is a primary that bounds a decision by a timeout itself,
// for less than a context with a timeout costs (the Redis store). A
// decision not made in time must fail, like one whose context ended.
type withinDecider interface {
	DecideWithin(ctx context.Context, timeout time.Duration, checks []store.Check, out []algorithms.Result) error
}

// tryPrimary runs checks on the primary and waits at most the deadline,
// whether or not the primary honours its context (unless TrustContext).
func (s *Store) tryPrimary(ctx context.Context, checks []store.Check, out []algorithms.Result) error {
	if w, ok := s.primary.(withinDecider); ok && s.trustContext {
		start := time.Now()
		err := w.DecideWithin(ctx, s.deadline, checks, out)
		if err != nil && ctx.Err() == nil && time.Since(start) >= s.deadline {
			return fmt.Errorf("%w (%v): %v", ErrDeadline, s.deadline, err)
		}
		return err
	}
	if s.trustContext {
		pctx, cancel := context.WithTimeout(ctx, s.deadline)
		defer cancel()
		err := s.primary.Decide(pctx, checks, out)
		if err != nil && pctx.Err() == context.DeadlineExceeded && ctx.Err() == nil {
			return fmt.Errorf("%w (%v): %v", ErrDeadline, s.deadline, err)
		}
		return err
	}
	c := s.calls.Get().(*call)
	c.checks = append(c.checks[:0], checks...)
	c.ownOnces()
	if cap(c.out) < len(checks) {
		c.out = make([]algorithms.Result, len(checks))
	}
	c.out = c.out[:len(checks)]
	pctx, cancel := context.WithTimeout(ctx, s.deadline)
	defer cancel()
	go func() { c.done <- s.primary.Decide(pctx, c.checks, c.out) }()
	select {
	case err := <-c.done:
		if err == nil {
			copy(out, c.out)
			for k := range checks {
				if o := checks[k].Once; o != nil {
					o.Duplicate = c.checks[k].Once.Duplicate
				}
			}
		}
		clear(c.checks) // drop key references while pooled
		clear(c.onces)
		s.calls.Put(c)
		if err != nil && pctx.Err() == context.DeadlineExceeded && ctx.Err() == nil {
			return fmt.Errorf("%w (%v): %v", ErrDeadline, s.deadline, err)
		}
		return err
	case <-pctx.Done():
		// The attempt still owns c; it is left to the garbage collector.
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%w (%v)", ErrDeadline, s.deadline)
	}
}

// enterDegraded switches to the fallback (once) and starts the prober.
func (s *Store) enterDegraded(cause error) {
	if !s.degraded.CompareAndSwap(false, true) {
		return
	}
	s.noSeed.Store(true)
	s.metrics.Degraded.Set(1)
	s.metrics.Transitions.WithLabelValues("fallback").Inc()
	s.log.Warn("primary store failing: deciding from the fallback store",
		"primary", s.primary.Name(), "fallback", s.fallback.Name(), "error", cause.Error())
	if s.onChange != nil {
		s.onChange(true)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.probing || s.closed {
		return
	}
	s.probing = true
	s.wg.Add(1)
	go s.runProber()
}

// runProber probes every probeInterval until a probe succeeds or Close.
func (s *Store) runProber() {
	defer s.wg.Done()
	t := time.NewTicker(s.probeInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			s.mu.Lock()
			s.probing = false
			s.mu.Unlock()
			return
		case <-t.C:
		}
		if s.ProbeOnce(context.Background()) {
			s.mu.Lock()
			s.probing = false
			// A decision may have failed again between the switch and
			// here; if so it found probing set, so keep probing.
			again := s.degraded.Load() && !s.closed
			if again {
				s.probing = true
			}
			s.mu.Unlock()
			if !again {
				return
			}
		}
	}
}

// ProbeOnce probes the primary now. If the probe succeeds while degraded,
// decisions switch back to the primary. It reports whether the probe
// succeeded. The background prober calls it; tests may too.
func (s *Store) ProbeOnce(ctx context.Context) bool {
	pctx, cancel := context.WithTimeout(ctx, s.probeTimeout)
	defer cancel()
	if err := s.probe(pctx); err != nil {
		s.metrics.ProbeFailures.Inc()
		s.log.Debug("primary store probe failed", "primary", s.primary.Name(), "error", err.Error())
		return false
	}
	if s.degraded.Load() {
		s.recover(ctx)
	}
	return true
}

// Close stops the background prober and waits for it. Decide keeps working
// afterwards, but a degraded Store then stays degraded.
func (s *Store) Close() {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		close(s.stop)
	}
	s.mu.Unlock()
	s.wg.Wait()
}
