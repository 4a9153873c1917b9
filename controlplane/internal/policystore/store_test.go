package policystore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/controlplane/policy"
	"github.com/sluicehq/sluice/internal/redistest"
)

// convergeBound is how soon every replica must see a change. The issue asks
// for 2 s; with notifications it takes milliseconds, and a replica that
// missed them polls every DefaultPollInterval (1 s).
const convergeBound = 2 * time.Second

// testLogger logs to the test's output.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// domainYAML is a one-limit policy for domain admitting n per second.
func domainYAML(domain string, n int) []byte {
	return fmt.Appendf(nil, "domain: %s\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: second\n      requests_per_unit: %d\n", domain, n)
}

// requestsOf returns the requests_per_unit a request {user: x} of domain
// matches in snap (what a decision would use), or -1 when nothing matches.
func requestsOf(snap *Snapshot, domain string) int64 {
	ls := snap.Set.Domain(domain).Match([]policy.Entry{{Key: "user", Value: "x"}})
	if len(ls) != 1 {
		return -1
	}
	return ls[0].Requests
}

// newStore returns a Store on b, closed when the test ends.
func newStore(t testing.TB, b Backend, opts Options) *Store {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = testLogger(t)
	}
	s, err := New(t.Context(), b, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// waitFor waits until cond holds for st's snapshot and returns how long it
// took; it fails the test after limit.
func waitFor(t testing.TB, st *Store, limit time.Duration, what string, cond func(*Snapshot) bool) time.Duration {
	t.Helper()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	var snap *Snapshot
	for {
		next, err := st.Next(ctx, snap)
		if err != nil {
			cur := st.Current()
			t.Fatalf("%s: not within %v (replica at version %d, %d domains)", what, limit, cur.Version, cur.Set.Len())
		}
		snap = next
		if cond(snap) {
			return time.Since(start)
		}
	}
}

// sameState reports whether two snapshots hold the same version and
// policies.
func sameState(a, b *Snapshot) bool {
	if a.Version != b.Version || len(a.Policies()) != len(b.Policies()) {
		return false
	}
	for i, p := range a.Policies() {
		q := b.Policies()[i]
		if p.Domain != q.Domain || p.Version != q.Version || string(p.YAML) != string(q.YAML) || !p.Parsed.Equal(q.Parsed) {
			return false
		}
	}
	return true
}

// TestReplicasConverge: a change applied on replica A reaches replicas B and
// C within the bound, also when B was cut off from Redis during the change
// and came back.
func TestReplicasConverge(t *testing.T) {
	srv := redistest.StartServer(t)
	proxy := startProxy(t, srv.Addr())
	ctx := context.Background()
	a := newStore(t, newRedisBackend(t, srv.Addr()), Options{})
	b := newStore(t, newRedisBackend(t, proxy.Addr()), Options{})
	c := newStore(t, newRedisBackend(t, srv.Addr()), Options{})

	res, err := a.Apply(ctx, "api.yaml", domainYAML("api", 10), Guard{})
	if err != nil {
		t.Fatal(err)
	}
	if got := requestsOf(a.Current(), "api"); got != 10 || a.Current().Version < res.Version {
		t.Fatalf("replica A after its own Apply: limit %d at version %d; want 10 at >= %d", got, a.Current().Version, res.Version)
	}
	for name, r := range map[string]*Store{"B": b, "C": c} {
		d := waitFor(t, r, convergeBound, "replica "+name+" sees the apply", func(s *Snapshot) bool { return requestsOf(s, "api") == 10 })
		t.Logf("replica %s converged in %v", name, d)
	}

	// Cut B off, change two domains and delete one while it cannot hear.
	proxy.Cut()
	if _, err := a.Apply(ctx, "api.yaml", domainYAML("api", 20), Guard{}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Apply(ctx, "web.yaml", domainYAML("web", 5), Guard{}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Apply(ctx, "tmp.yaml", domainYAML("tmp", 1), Guard{}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Delete(ctx, "tmp", Guard{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, c, convergeBound, "replica C sees the changes", func(s *Snapshot) bool { return s.Version == a.Current().Version })
	// B must not have them: it is cut off, and a Refresh fails.
	if err := b.refresh(ctx); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("replica B refresh while cut off: err = %v; want ErrUnavailable", err)
	}
	if got := requestsOf(b.Current(), "api"); got != 10 {
		t.Fatalf("replica B while cut off: limit %d; want the old 10", got)
	}

	proxy.Restore()
	d := waitFor(t, b, convergeBound, "replica B sees the changes after reconnecting",
		func(s *Snapshot) bool { return s.Version == a.Current().Version })
	t.Logf("replica B converged %v after the link came back", d)
	if !sameState(b.Current(), a.Current()) || requestsOf(b.Current(), "api") != 20 || requestsOf(b.Current(), "web") != 5 ||
		b.Current().Policy("tmp") != nil {
		t.Fatalf("replica B after reconnecting: %+v; want A's state %+v", b.Current().Policies(), a.Current().Policies())
	}

	// A replica started later loads the current set (the seed is ignored:
	// the store is not empty).
	seed, err := policy.NewSet(mustParse(t, domainYAML("seeded", 1)))
	if err != nil {
		t.Fatal(err)
	}
	late := newStore(t, newRedisBackend(t, srv.Addr()), Options{Seed: seed})
	if !late.Ready() || !sameState(late.Current(), a.Current()) {
		t.Fatalf("a replica started later: ready %v, %+v; want A's state", late.Ready(), late.Current().Policies())
	}
}

// mustParse parses a policy.
func mustParse(t testing.TB, data []byte) *policy.Domain {
	t.Helper()
	d, err := policy.Parse("test.yaml", data)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestNoLostUpdate: 20 writers on three replicas each add 5 to a counter
// held in one domain by read-modify-write with a version guard, retrying on
// conflict. Every increment must land exactly once, each winning version
// must be unique, and a watcher must never see a state that no writer
// wrote (a torn or mixed read).
func TestNoLostUpdate(t *testing.T) {
	srv := redistest.StartServer(t)
	replicas := make([]*Store, 3)
	for i := range replicas {
		replicas[i] = newStore(t, newRedisBackend(t, srv.Addr()), Options{Logger: slog.New(slog.DiscardHandler)})
	}
	ctx := context.Background()
	const writers, increments = 20, 5
	first, err := replicas[0].Apply(ctx, "c.yaml", counterYAML(0), Expect(0))
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range replicas {
		waitFor(t, r, convergeBound, fmt.Sprintf("replica %d sees the counter", i),
			func(s *Snapshot) bool { return s.Policy("counter") != nil })
	}

	// Every state a watcher on replica 2 sees.
	type seen struct{ version, counter uint64 }
	var seenMu sync.Mutex
	var seenStates []seen
	watchCtx, stopWatch := context.WithCancel(ctx)
	watchDone := make(chan error, 1)
	go func() {
		watchDone <- replicas[2].Watch(watchCtx, func(s *Snapshot) {
			p := s.Policy("counter")
			if p == nil {
				return
			}
			seenMu.Lock()
			seenStates = append(seenStates, seen{p.Version, counterOf(t, p.Parsed)})
			seenMu.Unlock()
		})
	}()

	var mu sync.Mutex
	won := map[uint64]uint64{} // version -> counter written
	conflicts := 0
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st := replicas[w%len(replicas)]
			for range increments {
				for attempt := 0; ; attempt++ {
					if attempt > 500 {
						errs <- errors.New("writer starved after 500 conflicts")
						return
					}
					cur := st.Current().Policy("counter")
					n := counterOf(t, cur.Parsed) + 1
					res, err := st.Apply(ctx, "c.yaml", counterYAML(n), Expect(cur.Version))
					var ce *ConflictError
					if errors.As(err, &ce) {
						mu.Lock()
						conflicts++
						mu.Unlock()
						// Stale view: wait for this replica to load a newer one.
						if ce.Actual > st.Current().Policy("counter").Version {
							waitCtx, cancel := context.WithTimeout(ctx, convergeBound)
							for st.Current().Policy("counter").Version < ce.Actual {
								if _, err := st.Next(waitCtx, st.Current()); err != nil {
									break
								}
							}
							cancel()
						}
						continue
					}
					if err != nil {
						errs <- err
						return
					}
					mu.Lock()
					if prev, dup := won[res.Version]; dup {
						errs <- fmt.Errorf("version %d won twice (counters %d and %d)", res.Version, prev, n)
					}
					won[res.Version] = n
					mu.Unlock()
					break
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(won) != writers*increments {
		t.Fatalf("%d applies won; want %d", len(won), writers*increments)
	}
	// The counters written, in version order, are exactly 1..100.
	var last uint64
	for v := uint64(0); len(won) > 0 && v <= 10*writers*increments+10; v++ {
		if n, ok := won[v]; ok {
			if n != last+1 {
				t.Fatalf("version %d wrote counter %d after %d: an update was lost", v, n, last)
			}
			last = n
		}
	}
	if last != writers*increments {
		t.Fatalf("final counter %d; want %d", last, writers*increments)
	}
	for i, r := range replicas {
		waitFor(t, r, convergeBound, fmt.Sprintf("replica %d sees the last write", i),
			func(s *Snapshot) bool { return counterOf(t, s.Policy("counter").Parsed) == writers*increments })
	}
	stopWatch()
	if err := <-watchDone; !errors.Is(err, context.Canceled) {
		t.Fatalf("Watch returned %v; want context.Canceled", err)
	}
	for _, s := range seenStates {
		if s.version == first.Version && s.counter == 0 {
			continue // the initial apply
		}
		if n, ok := won[s.version]; !ok || n != s.counter {
			t.Fatalf("the watcher saw counter %d at version %d, which no writer wrote (writer: %d, %v)", s.counter, s.version, n, ok)
		}
	}
	t.Logf("%d increments, %d conflicts retried, the watcher saw %d versions", len(won), conflicts, len(seenStates))
}

// counterYAML is a policy whose two limits both carry n, so that a torn
// write would show as two different numbers.
func counterYAML(n uint64) []byte {
	return fmt.Appendf(nil, `domain: counter
descriptors:
  - key: a
    rate_limit: {unit: hour, requests_per_unit: %d}
  - key: b
    rate_limit: {unit: hour, requests_per_unit: %d}
`, n+1, n+1)
}

// counterOf reads the counter of a counterYAML policy.
func counterOf(t testing.TB, d *policy.Domain) uint64 {
	ls := d.Limits()
	if len(ls) != 2 || ls[0].Requests != ls[1].Requests {
		t.Errorf("torn counter policy: %d limits", len(ls))
		return 0
	}
	return uint64(ls[0].Requests - 1)
}

// TestConcurrentGuardedApplies: 100 Apply calls at once, all guarded by the
// same version: exactly one wins; every other gets a conflict naming the
// winner's version; the store holds the winner's policy.
func TestConcurrentGuardedApplies(t *testing.T) {
	srv := redistest.StartServer(t)
	var replicas []*Store
	for range 3 {
		replicas = append(replicas, newStore(t, newRedisBackend(t, srv.Addr()), Options{Logger: slog.New(slog.DiscardHandler)}))
	}
	ctx := context.Background()
	base, err := replicas[0].Apply(ctx, "api.yaml", domainYAML("api", 1), Guard{})
	if err != nil {
		t.Fatal(err)
	}
	const callers = 100
	type outcome struct {
		n   int
		res ApplyResult
		err error
	}
	out := make(chan outcome, callers)
	start := make(chan struct{})
	for i := range callers {
		go func() {
			<-start
			res, err := replicas[i%3].Apply(ctx, "api.yaml", domainYAML("api", 100+i), Expect(base.Version))
			out <- outcome{100 + i, res, err}
		}()
	}
	close(start)
	winner := -1
	var winVersion uint64
	var conflicts []*ConflictError
	for range callers {
		o := <-out
		var ce *ConflictError
		switch {
		case o.err == nil:
			if winner >= 0 {
				t.Fatalf("two winners: %d and %d", winner, o.n)
			}
			winner, winVersion = o.n, o.res.Version
		case errors.As(o.err, &ce):
			conflicts = append(conflicts, ce)
		default:
			t.Fatalf("caller %d: %v", o.n, o.err)
		}
	}
	if winner < 0 || len(conflicts) != callers-1 {
		t.Fatalf("winner %d, %d conflicts; want one winner and %d conflicts", winner, len(conflicts), callers-1)
	}
	for _, ce := range conflicts {
		if ce.Expected != base.Version || ce.Actual != winVersion {
			t.Fatalf("conflict %+v; want expected %d, actual %d", ce, base.Version, winVersion)
		}
	}
	msg := conflicts[0].Error()
	for _, want := range []string{`domain "api"`, fmt.Sprintf("expected version %d", base.Version),
		fmt.Sprintf("the store has version %d", winVersion), "retry with the new version"} {
		if !strings.Contains(msg, want) {
			t.Errorf("conflict message %q lacks %q", msg, want)
		}
	}
	st, err := replicas[0].Backend().Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Version != winVersion || len(st.Records) != 1 || string(st.Records[0].YAML) != string(domainYAML("api", winner)) {
		t.Fatalf("store after the race: %+v; want only the winner's policy (%d) at version %d", st, winner, winVersion)
	}
	for i, r := range replicas {
		waitFor(t, r, convergeBound, fmt.Sprintf("replica %d sees the winner", i),
			func(s *Snapshot) bool { return requestsOf(s, "api") == int64(winner) })
	}
}

// TestSeedOnlyEmptyStore: the start-up policies seed an empty store, and
// never a store that holds anything, even an empty set after deletions.
func TestSeedOnlyEmptyStore(t *testing.T) {
	srv := redistest.StartServer(t)
	ctx := context.Background()
	seed1, _ := policy.NewSet(mustParse(t, domainYAML("one", 1)), mustParse(t, domainYAML("two", 2)))
	a := newStore(t, newRedisBackend(t, srv.Addr()), Options{Seed: seed1})
	if v := a.Current().Version; v != 1 || requestsOf(a.Current(), "one") != 1 || requestsOf(a.Current(), "two") != 2 {
		t.Fatalf("seeded store: version %d, %+v; want version 1 with the seed", v, a.Current().Policies())
	}
	seed2, _ := policy.NewSet(mustParse(t, domainYAML("three", 3)))
	b := newStore(t, newRedisBackend(t, srv.Addr()), Options{Seed: seed2})
	if !sameState(a.Current(), b.Current()) || b.Current().Policy("three") != nil {
		t.Fatalf("second replica with another seed: %+v; want the first seed only", b.Current().Policies())
	}
	if !a.Seeded() || b.Seeded() {
		t.Fatalf("Seeded: first replica %v, second %v; want true, false", a.Seeded(), b.Seeded())
	}
	for _, d := range []string{"one", "two"} {
		if _, err := a.Delete(ctx, d, Guard{}); err != nil {
			t.Fatal(err)
		}
	}
	c := newStore(t, newRedisBackend(t, srv.Addr()), Options{Seed: seed2})
	if c.Current().Set.Len() != 0 || c.Current().Version != 3 {
		t.Fatalf("replica started on an emptied store: version %d, %d domains; want version 3, none (no reseed)",
			c.Current().Version, c.Current().Set.Len())
	}
}

// TestLostStoreWrittenBack: Redis restarted without persistence loses the
// policies; a replica that held them writes them back (with their
// versions), rather than every replica dropping every limit.
func TestLostStoreWrittenBack(t *testing.T) {
	srv := redistest.StartServer(t)
	ctx := context.Background()
	a := newStore(t, newRedisBackend(t, srv.Addr()), Options{})
	if _, err := a.Apply(ctx, "api.yaml", domainYAML("api", 7), Guard{}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Apply(ctx, "web.yaml", domainYAML("web", 8), Guard{}); err != nil {
		t.Fatal(err)
	}
	before := a.Current()
	srv.Kill()
	srv.Restart()
	b := newRedisBackend(t, srv.Addr())
	deadline := time.Now().Add(2 * convergeBound)
	for {
		st, err := b.Load(ctx)
		if err == nil && st.Version == before.Version {
			if len(st.Records) != 2 || st.Records[0].Version != before.Policy("api").Version ||
				string(st.Records[1].YAML) != string(before.Policy("web").YAML) {
				t.Fatalf("written back: %+v; want A's policies and versions", st)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the lost store was not written back within %v (last: %+v, %v)", 2*convergeBound, st, err)
		}
		time.Sleep(20 * time.Millisecond) // polling a real server for a background write
	}
	if !sameState(a.Current(), before) {
		t.Fatalf("replica A changed while the store was lost: %+v", a.Current().Policies())
	}
	// An Apply right after a loss must not drop the other domains either.
	srv.Kill()
	srv.Restart()
	if _, err := a.Apply(ctx, "new.yaml", domainYAML("new", 9), Guard{}); err != nil {
		t.Fatal(err)
	}
	st, err := b.Load(ctx)
	if err != nil || len(st.Records) != 3 {
		t.Fatalf("after a loss and an Apply: %+v, %v; want api, new and web", st, err)
	}
}

// TestStartWithoutBackend: a replica that cannot reach Redis at start serves
// its start-up policies, then seeds and follows the store once it can.
func TestStartWithoutBackend(t *testing.T) {
	// Redis is unreachable through a cut proxy rather than killed: a killed
	// server's port can be taken by another test's redis-server meanwhile.
	srv := redistest.StartServer(t)
	link := startProxy(t, srv.Addr())
	link.Cut()
	seed, _ := policy.NewSet(mustParse(t, domainYAML("api", 4)))
	ctx := context.Background()
	s, err := New(ctx, newRedisBackend(t, link.Addr()), Options{Seed: seed, Logger: testLogger(t), Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Ready() || requestsOf(s.Current(), "api") != 4 || s.Current().Version != 0 {
		t.Fatalf("without Redis: ready %v, version %d; want the seed at version 0", s.Ready(), s.Current().Version)
	}
	applyCtx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := s.Apply(applyCtx, "x.yaml", domainYAML("x", 1), Guard{}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Apply without Redis: err = %v; want ErrUnavailable", err)
	}
	link.Restore()
	d := waitFor(t, s, convergeBound, "the store is seeded once Redis is up", func(s *Snapshot) bool { return s.Version == 1 })
	if !s.Ready() || requestsOf(s.Current(), "api") != 4 {
		t.Fatalf("after Redis came up: ready %v, %+v", s.Ready(), s.Current().Policies())
	}
	t.Logf("seeded %v after Redis came up", d)
}

// TestClosedStore: after Close, writes and waits fail with ErrClosed.
func TestClosedStore(t *testing.T) {
	b, err := NewFile(t.TempDir() + "/p.json")
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(context.Background(), b, Options{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	ctx := context.Background()
	if _, err := s.Apply(ctx, "", domainYAML("a", 1), Guard{}); !errors.Is(err, ErrClosed) {
		t.Errorf("Apply after Close: %v", err)
	}
	if _, err := s.Delete(ctx, "a", Guard{}); !errors.Is(err, ErrClosed) {
		t.Errorf("Delete after Close: %v", err)
	}
	if _, err := s.Next(ctx, s.Current()); !errors.Is(err, ErrClosed) {
		t.Errorf("Next after Close: %v", err)
	}
	if s.Current() == nil {
		t.Error("Current after Close is nil")
	}
}

// silent is a backend whose change notifications never arrive.
type silent struct{ Backend }

// Subscribe returns a channel that stays quiet until ctx ends.
func (silent) Subscribe(ctx context.Context) <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		<-ctx.Done()
		close(ch)
	}()
	return ch
}

// TestPollingAlone: a replica that receives no notification at all still
// converges within the bound, by polling the version.
func TestPollingAlone(t *testing.T) {
	srv := redistest.StartServer(t)
	a := newStore(t, newRedisBackend(t, srv.Addr()), Options{})
	deaf := newStore(t, silent{newRedisBackend(t, srv.Addr())}, Options{})
	for i := 1; i <= 2; i++ {
		if _, err := a.Apply(context.Background(), "api.yaml", domainYAML("api", i), Guard{}); err != nil {
			t.Fatal(err)
		}
		d := waitFor(t, deaf, convergeBound, "the deaf replica sees the apply",
			func(s *Snapshot) bool { return requestsOf(s, "api") == int64(i) })
		t.Logf("converged by polling alone in %v", d)
	}
}
