package degrade

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/store"
)

// Behaviours of the controllable primary.
const (
	answer  = iota // decide: every check allowed with Remaining 1
	fail           // return an error at once
	hang           // block, ignoring the context, until released
	invalid        // return an error wrapping store.ErrInvalidLimit
	slow           // block until the context ends, then return its error
)

// fakeStore is a store whose behaviour the test switches. It marks its
// answers with Remaining = mark so a test can tell which store answered.
type fakeStore struct {
	name    string
	mark    int64
	mode    atomic.Int32
	calls   atomic.Int64
	release chan struct{} // closed to let hanging calls return
}

func newFake(name string, mark int64) *fakeStore {
	return &fakeStore{name: name, mark: mark, release: make(chan struct{})}
}

func (f *fakeStore) Name() string { return f.name }

func (f *fakeStore) Decide(ctx context.Context, checks []store.Check, out []algorithms.Result) error {
	f.calls.Add(1)
	switch f.mode.Load() {
	case fail:
		return errors.New(f.name + ": connection refused")
	case hang:
		<-f.release
		return errors.New(f.name + ": released")
	case invalid:
		return fmt.Errorf("%w: checks[0]: limit must be at least 1", store.ErrInvalidLimit)
	case slow:
		<-ctx.Done()
		return fmt.Errorf("%s: %w", f.name, ctx.Err())
	}
	for i := range checks {
		out[i] = algorithms.Result{Allowed: true, Limit: checks[i].Limit.Requests, Remaining: f.mark}
	}
	return nil
}

// probeSwitch is a probe the test turns on and off.
type probeSwitch struct {
	ok    atomic.Bool
	calls atomic.Int64
}

func (p *probeSwitch) probe(ctx context.Context) error {
	p.calls.Add(1)
	if p.ok.Load() {
		return nil
	}
	return errors.New("PING: connection refused")
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func setup(t *testing.T, o Options) (*Store, *fakeStore, *fakeStore, *probeSwitch) {
	t.Helper()
	primary, fallback := newFake("primary", 1), newFake("fallback", 2)
	p := &probeSwitch{}
	if o.Probe == nil {
		o.Probe = p.probe
	}
	if o.ProbeInterval == 0 {
		o.ProbeInterval = time.Hour // tests drive probes with ProbeOnce unless they say otherwise
	}
	if o.Trip == (Trip{}) {
		o.Trip.Failures = 1 // these tests are about the switch itself (trip_test.go: when to switch)
	}
	o.Logger = quiet
	s, err := New(primary, fallback, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		close(primary.release)
		s.Close()
	})
	return s, primary, fallback, p
}

var checks = []store.Check{
	{Key: "a", Limit: store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 10, Window: time.Second}, Cost: 1},
	{Key: "b", Limit: store.Limit{Algorithm: algorithms.KindGCRA, Requests: 10, Window: time.Second}, Cost: 1},
}

// from returns which store answered (by the mark in Remaining).
func from(t *testing.T, s *Store) string {
	t.Helper()
	out := make([]algorithms.Result, len(checks))
	if err := s.Decide(context.Background(), checks, out); err != nil {
		t.Fatalf("Decide: %v", err)
	}
	switch out[0].Remaining {
	case 1:
		return "primary"
	case 2:
		return "fallback"
	}
	t.Fatalf("unmarked result %+v", out[0])
	return ""
}

func TestSwitching(t *testing.T) {
	for _, trust := range []bool{false, true} {
		t.Run(fmt.Sprintf("TrustContext=%v", trust), func(t *testing.T) { testSwitching(t, trust) })
	}
}

func testSwitching(t *testing.T, trust bool) {
	var changes []bool
	var mu sync.Mutex
	s, primary, fallback, probe := setup(t, Options{TrustContext: trust, OnChange: func(d bool) {
		mu.Lock()
		changes = append(changes, d)
		mu.Unlock()
	}})
	m := s.Metrics()
	if got := from(t, s); got != "primary" || s.Degraded() {
		t.Fatalf("healthy: answered by %s, degraded %v", got, s.Degraded())
	}
	primary.mode.Store(fail)
	if got := from(t, s); got != "fallback" {
		t.Fatalf("failing primary: the same call was answered by %s", got)
	}
	if !s.Degraded() || value(t, m.Degraded) != 1 {
		t.Fatal("not degraded after a primary error")
	}
	before := primary.calls.Load()
	for i := 0; i < 5; i++ {
		if got := from(t, s); got != "fallback" {
			t.Fatalf("degraded call answered by %s", got)
		}
	}
	if n := primary.calls.Load() - before; n != 0 {
		t.Fatalf("degraded calls still went to the primary %d times", n)
	}
	// The primary is back, but only a probe may say so.
	primary.mode.Store(answer)
	if s.ProbeOnce(context.Background()) || !s.Degraded() {
		t.Fatal("a failed probe switched back")
	}
	probe.ok.Store(true)
	if !s.ProbeOnce(context.Background()) || s.Degraded() {
		t.Fatal("a successful probe did not switch back")
	}
	if got := from(t, s); got != "primary" {
		t.Fatalf("after recovery answered by %s", got)
	}
	if got := value(t, m.DegradedDecisions); got != 6 {
		t.Errorf("degraded decisions %v, want 6", got)
	}
	if a, b := value(t, m.Transitions.WithLabelValues("fallback")), value(t, m.Transitions.WithLabelValues("primary")); a != 1 || b != 1 {
		t.Errorf("transitions to fallback %v, to primary %v; want 1 and 1", a, b)
	}
	if got := value(t, m.PrimaryFailures.WithLabelValues("error")); got != 1 {
		t.Errorf("primary errors %v, want 1", got)
	}
	if got := value(t, m.ProbeFailures); got != 1 {
		t.Errorf("probe failures %v, want 1", got)
	}
	if value(t, m.Degraded) != 0 {
		t.Error("degraded gauge not reset")
	}
	if fallback.calls.Load() != 6 {
		t.Errorf("fallback calls %d, want 6", fallback.calls.Load())
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(changes) != "[true false]" {
		t.Errorf("OnChange calls %v, want [true false]", changes)
	}
}

// TestDeadline: a primary that hangs is abandoned after the deadline and the
// call is answered by the fallback: one that ignores its context, and, with
// TrustContext, one that honours it.
func TestDeadline(t *testing.T) {
	for _, trust := range []bool{false, true} {
		t.Run(fmt.Sprintf("TrustContext=%v", trust), func(t *testing.T) { testDeadline(t, trust) })
	}
}

func testDeadline(t *testing.T, trust bool) {
	const deadline = 30 * time.Millisecond
	s, primary, _, _ := setup(t, Options{Deadline: deadline, TrustContext: trust})
	if trust {
		primary.mode.Store(slow)
	} else {
		primary.mode.Store(hang)
	}
	start := time.Now()
	got := from(t, s)
	took := time.Since(start)
	if got != "fallback" || !s.Degraded() {
		t.Fatalf("hanging primary: answered by %s, degraded %v", got, s.Degraded())
	}
	if took < deadline || took > deadline+time.Second {
		t.Fatalf("answered after %v with a %v deadline", took, deadline)
	}
	if got := value(t, s.Metrics().PrimaryFailures.WithLabelValues("deadline")); got != 1 {
		t.Errorf("deadline failures %v, want 1", got)
	}
}

// TestBackgroundProber: once degraded, the prober switches back by itself
// as soon as probes succeed.
func TestBackgroundProber(t *testing.T) {
	s, primary, _, probe := setup(t, Options{ProbeInterval: 5 * time.Millisecond})
	primary.mode.Store(fail)
	from(t, s)
	if !s.Degraded() {
		t.Fatal("not degraded")
	}
	// Probes fail for a while: still degraded.
	deadline := time.Now().Add(5 * time.Second)
	for probe.calls.Load() < 3 {
		if time.Now().After(deadline) {
			t.Fatal("the prober did not run")
		}
		time.Sleep(time.Millisecond)
	}
	if !s.Degraded() {
		t.Fatal("switched back while probes failed")
	}
	primary.mode.Store(answer)
	probe.ok.Store(true)
	for s.Degraded() {
		if time.Now().After(deadline) {
			t.Fatal("the prober did not switch back within 5 s")
		}
		time.Sleep(time.Millisecond)
	}
	if got := from(t, s); got != "primary" {
		t.Fatalf("after the prober switched back: %s", got)
	}
	// A second failure starts a new prober.
	probe.ok.Store(false)
	primary.mode.Store(fail)
	from(t, s)
	n := probe.calls.Load()
	for probe.calls.Load() < n+2 {
		if time.Now().After(deadline) {
			t.Fatal("no prober after the second failure")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestFallbackFails(t *testing.T) {
	s, primary, fallback, _ := setup(t, Options{})
	primary.mode.Store(fail)
	fallback.mode.Store(fail)
	err := s.Decide(context.Background(), checks, make([]algorithms.Result, len(checks)))
	if err == nil || !strings.Contains(err.Error(), "fallback fallback failed") {
		t.Fatalf("error %v: want one naming the failed fallback", err)
	}
}

func TestNotPrimaryFaults(t *testing.T) {
	s, primary, _, _ := setup(t, Options{})
	primary.mode.Store(invalid)
	err := s.Decide(context.Background(), checks, make([]algorithms.Result, len(checks)))
	if !errors.Is(err, store.ErrInvalidLimit) || s.Degraded() {
		t.Fatalf("invalid check: error %v, degraded %v; want ErrInvalidLimit and not degraded", err, s.Degraded())
	}
	primary.mode.Store(hang)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = s.Decide(ctx, checks, make([]algorithms.Result, len(checks)))
	if !errors.Is(err, context.Canceled) || s.Degraded() {
		t.Fatalf("canceled caller: error %v, degraded %v; want context.Canceled and not degraded", err, s.Degraded())
	}
	if err := s.Decide(context.Background(), checks, nil); err == nil {
		t.Fatal("no error for a short out slice")
	}
}

func TestNewValidates(t *testing.T) {
	a, b := newFake("a", 1), newFake("b", 2)
	probe := func(context.Context) error { return nil }
	cases := []struct {
		name    string
		p, f    store.Store
		o       Options
		problem string
	}{
		{"nil primary", nil, b, Options{Probe: probe}, "primary store is nil"},
		{"nil fallback", a, nil, Options{Probe: probe}, "fallback store is nil"},
		{"no probe", a, b, Options{}, "Probe is required"},
		{"negative deadline", a, b, Options{Probe: probe, Deadline: -1}, "Deadline must not be negative"},
		{"negative interval", a, b, Options{Probe: probe, ProbeInterval: -1}, "ProbeInterval must not be negative"},
	}
	for _, c := range cases {
		if _, err := New(c.p, c.f, c.o); err == nil || !strings.Contains(err.Error(), c.problem) {
			t.Errorf("%s: error %v, want %q", c.name, err, c.problem)
		}
	}
	reg := prometheus.NewRegistry()
	s, err := New(a, b, Options{Probe: probe, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Name() != "a|b" {
		t.Errorf("Name %q", s.Name())
	}
	if mfs, err := reg.Gather(); err != nil || len(mfs) != 6 {
		t.Errorf("metrics not registered: %d families, %v", len(mfs), err)
	}
}

// TestConcurrent flips the primary while many goroutines decide: every call
// is answered (run with -race).
func TestConcurrent(t *testing.T) {
	s, primary, fallback, probe := setup(t, Options{ProbeInterval: time.Millisecond, Deadline: 50 * time.Millisecond})
	// progress waits until the callers have made n more store calls.
	progress := func(n int64) {
		target := primary.calls.Load() + fallback.calls.Load() + n
		deadline := time.Now().Add(10 * time.Second)
		for primary.calls.Load()+fallback.calls.Load() < target {
			if time.Now().After(deadline) {
				t.Fatal("callers made no progress within 10 s")
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	var wg sync.WaitGroup
	var errs atomic.Int64
	stop := make(chan struct{})
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := make([]algorithms.Result, len(checks))
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := s.Decide(context.Background(), checks, out); err != nil {
					errs.Add(1)
				}
				if out[0].Remaining != 1 && out[0].Remaining != 2 {
					errs.Add(1)
				}
			}
		}()
	}
	for i := 0; i < 20; i++ {
		primary.mode.Store(fail)
		probe.ok.Store(false)
		progress(50)
		primary.mode.Store(answer)
		probe.ok.Store(true)
		progress(50)
	}
	close(stop)
	wg.Wait()
	if n := errs.Load(); n != 0 {
		t.Fatalf("%d calls failed or were unanswered", n)
	}
}

// value returns the value of a single-metric counter or gauge.
func value(t *testing.T, c prometheus.Collector) float64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 1)
	c.Collect(ch)
	var m dto.Metric
	if err := (<-ch).Write(&m); err != nil {
		t.Fatal(err)
	}
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	}
	t.Fatal("not a counter or gauge")
	return 0
}

// withinFake is a fakeStore that bounds decisions itself (DecideWithin), as
// the Redis store does.
type withinFake struct {
	*fakeStore
	within atomic.Int64 // DecideWithin calls
}

func (w *withinFake) DecideWithin(ctx context.Context, timeout time.Duration, checks []store.Check, out []algorithms.Result) error {
	w.within.Add(1)
	if w.mode.Load() == slow {
		w.calls.Add(1)
		select {
		case <-time.After(timeout):
			return fmt.Errorf("%s: %w", w.name, context.DeadlineExceeded)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return w.Decide(ctx, checks, out)
}

// TestDecideWithin: with TrustContext, a primary that bounds decisions
// itself is asked to, with the deadline; one that misses it degrades the
// store with reason deadline.
func TestDecideWithin(t *testing.T) {
	const deadline = 30 * time.Millisecond
	primary := &withinFake{fakeStore: newFake("primary", 1)}
	fallback := newFake("fallback", 2)
	s, err := New(primary, fallback, Options{Probe: (&probeSwitch{}).probe, ProbeInterval: time.Hour,
		Deadline: deadline, TrustContext: true, Logger: quiet, Trip: Trip{Failures: 1}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { close(primary.release); s.Close() })
	if got := from(t, s); got != "primary" || primary.within.Load() != 1 {
		t.Fatalf("answered by %s after %d DecideWithin calls", got, primary.within.Load())
	}
	primary.mode.Store(slow)
	start := time.Now()
	got := from(t, s)
	took := time.Since(start)
	if got != "fallback" || !s.Degraded() {
		t.Fatalf("slow primary: answered by %s, degraded %v", got, s.Degraded())
	}
	if took < deadline || took > deadline+time.Second {
		t.Fatalf("answered after %v with a %v deadline", took, deadline)
	}
	if got := value(t, s.Metrics().PrimaryFailures.WithLabelValues("deadline")); got != 1 {
		t.Errorf("deadline failures %v, want 1", got)
	}
	// Without TrustContext the store does not rely on the primary's own
	// bound.
	s2, err := New(primary, fallback, Options{Probe: (&probeSwitch{}).probe, ProbeInterval: time.Hour,
		Deadline: deadline, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	primary.mode.Store(answer)
	before := primary.within.Load()
	if got := from(t, s2); got != "primary" || primary.within.Load() != before {
		t.Fatalf("answered by %s; DecideWithin called %d times", got, primary.within.Load()-before)
	}
}
