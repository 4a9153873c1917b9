package lease

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/calendar"
	"github.com/sluicehq/sluice/controlplane/store"
	redisstore "github.com/sluicehq/sluice/controlplane/store/redis"
	"github.com/sluicehq/sluice/internal/redistest"
)

// clock is an injected time shared by Redis's scripts and the lease layers.
type clock struct{ us atomic.Int64 }

func (c *clock) Now() time.Time { return time.UnixMicro(c.us.Load()) }

// replicas returns n lease layers, each on its own Redis store, all on one
// redis-server and one clock.
func replicas(t *testing.T, n int, clk *clock, opts Options) []*Store {
	t.Helper()
	srv := redistest.StartServer(t)
	var out []*Store
	for range n {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
		t.Cleanup(func() { c.Close() })
		rs, err := redisstore.New(c, redisstore.Options{Now: clk.Now})
		if err != nil {
			t.Fatal(err)
		}
		opts.Now = clk.Now
		opts.Replicas = func() int { return n }
		s, err := New(rs, opts)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

// oracle decides one limit with package algorithms on microseconds.
func oracle(l store.Limit) func(now int64) bool {
	w := int64(l.Window / time.Microsecond)
	burst := capacity(l)
	var fw algorithms.FixedWindowState
	var sw algorithms.SlidingWindowState
	var tb algorithms.TokenBucketState
	var gc algorithms.GCRAState
	return func(now int64) bool {
		var r algorithms.Result
		var err error
		switch l.Algorithm {
		case algorithms.KindFixedWindow:
			r, err = algorithms.FixedWindow{Limit: l.Requests, Window: w, Aligned: true}.Allow(&fw, now, 1)
		case algorithms.KindSlidingWindow:
			r, err = algorithms.SlidingWindow{Limit: l.Requests, Window: w}.Allow(&sw, now, 1)
		case algorithms.KindTokenBucket:
			r, err = algorithms.TokenBucket{Rate: l.Requests, Period: w, Burst: burst}.Allow(&tb, now, 1)
		case algorithms.KindGCRA:
			r, err = algorithms.GCRA{MaxBurst: burst - 1, Count: l.Requests, Period: w}.Allow(&gc, now, 1)
		}
		return err == nil && r.Allowed
	}
}

// leasedLimits are one limit of each leasable algorithm at 1,000 a second,
// which the replica tests lease at half and at five times that.
var leasedLimits = []store.Limit{
	{Algorithm: algorithms.KindFixedWindow, Requests: 1000, Window: time.Second, Lease: true},
	{Algorithm: algorithms.KindSlidingWindow, Requests: 1000, Window: time.Second, Lease: true},
	{Algorithm: algorithms.KindTokenBucket, Requests: 1000, Window: time.Second, Burst: 200, Lease: true},
	{Algorithm: algorithms.KindGCRA, Requests: 1000, Window: time.Second, Burst: 100, Lease: true},
}

// TestReplicasExact: three replicas lease one key of each leasable
// algorithm from one Redis, at half the limit and then at five times it.
// Every admission, replayed at its time through package algorithms, is
// allowed (no over-admission); most are answered from leases; for the
// fixed window, each window admits exactly the limit minus the units that
// expired unspent in leases (the stated under-admission bound).
func TestReplicasExact(t *testing.T) {
	for _, l := range leasedLimits {
		t.Run(l.Algorithm.String(), func(t *testing.T) {
			clk := &clock{}
			start := int64(1_700_000_000_000_000)
			clk.us.Store(start)
			reps := replicas(t, 3, clk, Options{})
			ctx := context.Background()
			key := "k:" + l.Algorithm.String()
			allow := oracle(l)
			var admitted, perWindow, windows, under, steady, steadyLocal int64
			var lastExpired int64
			res := make([]algorithms.Result, 1)
			// 4 s: each millisecond every replica gets one request at half
			// the limit (1 in 6 ms), then 5 per millisecond (five times it).
			for ms := int64(0); ms < 4000; ms++ {
				now := start + ms*1000
				clk.us.Store(now)
				if ms%10 == 0 && ms%1000 != 0 {
					for _, r := range reps {
						r.Sweep(ctx, 20*time.Millisecond) // as Run every 10 ms
					}
				}
				if ms%1000 == 0 {
					var expired int64
					for _, r := range reps {
						r.Sweep(ctx, 0)
						expired += r.Stats().Expired
					}
					if ms >= 3000 && l.Algorithm == algorithms.KindFixedWindow {
						// a full window at five times the limit
						if perWindow > l.Requests || perWindow+(expired-lastExpired) < l.Requests {
							t.Errorf("window %d: %d admitted, %d expired in leases, limit %d", windows, perWindow, expired-lastExpired, l.Requests)
						}
						under += l.Requests - perWindow
					}
					lastExpired, perWindow = expired, 0
					windows++
				}
				if ms == 2000 {
					steady, steadyLocal = admitted, sum(reps).Local
				}
				per := int64(5)
				if ms < 2000 {
					per = 0
					if ms%6 == 0 {
						per = 1
					}
				}
				for _, r := range reps {
					for range per {
						if err := r.Decide(ctx, []store.Check{{Key: key, Limit: l, Cost: 1}}, res); err != nil {
							t.Fatal(err)
						}
						if res[0].Allowed {
							admitted++
							perWindow++
							if !allow(now) {
								t.Fatalf("at %d ms: admitted what the algorithm refuses", ms)
							}
						}
					}
				}
			}
			st := sum(reps)
			share := float64(steadyLocal) / float64(steady)
			t.Logf("below the limit: %d admitted, %.0f%% from leases; at 5x: %d admitted, %.0f%% from leases; "+
				"in all %d checks per request, %d lease calls, %d units returned, %d expired; fixed_window under-admission %d",
				steady, 100*share, admitted-steady, 100*float64(st.Local-steadyLocal)/float64(admitted-steady),
				st.PerRequest, st.LeaseCalls, st.Returned, st.Expired, under)
			if share < 0.8 {
				t.Errorf("only %.0f%% of admissions below the limit from leases", 100*share)
			}
		})
	}
}

// sum adds the replicas' stats.
func sum(reps []*Store) Stats {
	var st Stats
	for _, r := range reps {
		s := r.Stats()
		st.Local += s.Local
		st.PerRequest += s.PerRequest
		st.LeaseCalls += s.LeaseCalls
		st.Returned += s.Returned
		st.Expired += s.Expired
		st.Outstanding += s.Outstanding
	}
	return st
}

// TestReturnIdle: a token bucket lease left unused goes back to Redis, and
// another replica can then take those units.
func TestReturnIdle(t *testing.T) {
	clk := &clock{}
	clk.us.Store(1_700_000_000_000_000)
	reps := replicas(t, 2, clk, Options{Idle: 20 * time.Millisecond})
	l := store.Limit{Algorithm: algorithms.KindTokenBucket, Requests: 100, Window: time.Second, Burst: 100, Lease: true}
	ctx := context.Background()
	res := make([]algorithms.Result, 1)
	a, b := reps[0], reps[1]
	// a warms up (rate and remaining known) and takes a lease.
	for range 40 {
		clk.us.Add(2000)
		if err := a.Decide(ctx, []store.Check{{Key: "tb", Limit: l, Cost: 1}}, res); err != nil || !res[0].Allowed {
			t.Fatalf("%+v %v", res[0], err)
		}
	}
	held := a.Stats().Outstanding
	if held == 0 {
		t.Fatal("no lease after 40 requests at 500/s")
	}
	// b drains what Redis has, per request (a lease of b's would write the
	// state past a's end, and then a's units could not go back).
	lb := l
	lb.Lease = false
	got := 0
	for range 200 {
		if err := b.Decide(ctx, []store.Check{{Key: "tb", Limit: lb, Cost: 1}}, res); err != nil {
			t.Fatal(err)
		}
		if res[0].Allowed {
			got++
		}
	}
	// a's lease is idle: it goes back, and b gets exactly those units.
	clk.us.Add(30_000)
	n, err := a.Sweep(ctx, 0)
	if err != nil || n != held {
		t.Fatalf("returned %d of %d: %v", n, held, err)
	}
	more := 0
	for range int(held) + 5 {
		if err := b.Decide(ctx, []store.Check{{Key: "tb", Limit: lb, Cost: 1}}, res); err != nil {
			t.Fatal(err)
		}
		if res[0].Allowed {
			more++
		}
	}
	// 30 ms of refill at 100/s is 3 units, forgone while a's lease was
	// valid at most: b gets the returned units and at most the refill.
	if int64(more) < held || int64(more) > held+3 {
		t.Fatalf("after the return b got %d, %d were returned", more, held)
	}
	t.Logf("a held %d, b drained %d, then got %d after the return", held, got, more)
}

// TestNewWindowLeasedAtOnce: a fixed window's budget is spent, then the next
// window starts. The first check of the new window is answered by a lease
// sized from the full window (the last answer, 0 left, was the old window's
// and its reset time has passed), not sent per request.
func TestNewWindowLeasedAtOnce(t *testing.T) {
	clk := &clock{}
	start := int64(1_700_000_000_000_000)
	clk.us.Store(start)
	r := replicas(t, 1, clk, Options{})[0]
	l := store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 100, Window: time.Second, Lease: true}
	ctx := context.Background()
	res := make([]algorithms.Result, 1)
	check := []store.Check{{Key: "fw", Limit: l, Cost: 1}}
	for ms := range int64(900) { // 200/s until the window's 100 are spent
		clk.us.Store(start + ms*1000)
		if ms%5 == 0 {
			if err := r.Decide(ctx, check, res); err != nil {
				t.Fatal(err)
			}
		}
	}
	if res[0].Allowed {
		t.Fatalf("the window's budget is not spent: %+v", res[0])
	}
	before := r.Stats()
	clk.us.Store(start + 1_010_000) // the next window
	if err := r.Decide(ctx, check, res); err != nil || !res[0].Allowed {
		t.Fatalf("first check of the new window: %+v %v", res[0], err)
	}
	after := r.Stats()
	if after.PerRequest != before.PerRequest || after.LeaseCalls != before.LeaseCalls+1 || after.Outstanding < 50 {
		t.Fatalf("first check of the new window: %d per request, %d lease calls, %d units held (before: %+v)",
			after.PerRequest-before.PerRequest, after.LeaseCalls-before.LeaseCalls, after.Outstanding, before)
	}
}

// TestShareCoversUntilExpiry: a data plane that calls once is handed what
// the key is expected to use until the lease ends (the replica's rate times
// the validity left), up to all the replica holds, so that it need not call
// again for it; and never more than the replica holds.
func TestShareCoversUntilExpiry(t *testing.T) {
	clk := &clock{}
	start := int64(1_700_000_000_000_000)
	clk.us.Store(start)
	r := replicas(t, 3, clk, Options{})[0]
	l := store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 1000, Window: time.Second, Lease: true}
	ctx := context.Background()
	res := make([]algorithms.Result, 1)
	for ms := int64(0); ms <= 200; ms += 10 { // 100/s
		clk.us.Store(start + ms*1000)
		if err := r.Decide(ctx, []store.Check{{Key: "fw", Limit: l, Cost: 1}}, res); err != nil || !res[0].Allowed {
			t.Fatalf("%+v %v", res[0], err)
		}
	}
	held := r.Stats().Outstanding
	n, valid := r.Share("fw", l, 20*time.Millisecond, 7)
	// 100/s for the 800 ms left of the window: about 80 units
	want := min(held, int64(0.8*100*valid.Seconds()))
	if held == 0 || n < want || n > held || valid <= 0 || valid > 800*time.Millisecond {
		t.Fatalf("held %d, shared %d valid %v: want at least %d", held, n, valid, want)
	}
	if left := r.Stats().Outstanding; left != held-n {
		t.Fatalf("held %d, shared %d, %d left", held, n, left)
	}
}

// filterPool is a data plane's quota in TestFiltersExact: units it may
// spend until until (microseconds), as the filter keeps RLS quotas.
type filterPool struct{ units, until int64 }

// TestFiltersExact: three replicas on one Redis, each called by two data
// planes that spend the quotas the replica shares (Share, valid_until taken
// in by the RLS margin) and call only when theirs is spent or ended; one
// key per leasable algorithm at half the limit, then five times it. Every
// admission, from a quota or by a call, replayed at its time through
// package algorithms is allowed; for the fixed window, each window at 5x
// admits the limit less at most the units that ended unspent (in replicas
// and in data planes: the stated under-admission bound); below the limit,
// none is refused (no data plane holds what another needs) and the share
// decided in the data planes is at least 0.9 of what one call per lease
// per data plane allows.
func TestFiltersExact(t *testing.T) {
	const margin = 10 * time.Millisecond // rls quotaMargin
	for _, l := range leasedLimits {
		t.Run(l.Algorithm.String(), func(t *testing.T) {
			clk := &clock{}
			start := int64(1_700_000_000_000_000)
			clk.us.Store(start)
			reps := replicas(t, 3, clk, Options{})
			ctx := context.Background()
			key := "k:" + l.Algorithm.String()
			allow := oracle(l)
			pools := make([]filterPool, 2*len(reps))
			var perWindow, lost, lastExpired, steadyQuota, steadyCalled, steadyRefused int64
			res := make([]algorithms.Result, 1)
			// 4 s: each data plane gets one request every 12 ms (half the
			// limit among six), then 5 every 2 ms (five times it).
			for ms := int64(0); ms < 4000; ms++ {
				now := start + ms*1000
				clk.us.Store(now)
				if ms%10 == 0 {
					for _, r := range reps {
						r.Sweep(ctx, 20*time.Millisecond)
					}
				}
				if ms%1000 == 0 {
					var expired int64
					for i := range pools {
						if pools[i].units > 0 && pools[i].until <= now {
							lost += pools[i].units
							pools[i].units = 0
						}
					}
					for _, r := range reps {
						expired += r.Stats().Expired
					}
					if ms > 2000 && l.Algorithm == algorithms.KindFixedWindow {
						if perWindow+(expired-lastExpired)+lost < l.Requests {
							t.Errorf("window at %d ms: %d admitted, %d expired in replicas, %d in data planes, limit %d",
								ms, perWindow, expired-lastExpired, lost, l.Requests)
						}
					}
					perWindow, lost, lastExpired = 0, 0, expired
				}
				for f := range pools {
					per := int64(0)
					switch {
					case ms >= 2000 && ms%2 == int64(f%2):
						per = 5
					case ms < 2000 && ms%12 == int64(2*f):
						per = 1
					}
					p := &pools[f]
					for range per {
						if p.units > 0 && p.until <= now {
							lost += p.units
							p.units = 0
						}
						allowed, fromQuota := false, false
						if p.units > 0 {
							p.units--
							allowed, fromQuota = true, true
						} else {
							r := reps[f/2]
							if err := r.Decide(ctx, []store.Check{{Key: key, Limit: l, Cost: 1}}, res); err != nil {
								t.Fatal(err)
							}
							allowed = res[0].Allowed
							if allowed {
								if n, valid := r.Share(key, l, 20*time.Millisecond, uint64(f+1)); n > 0 {
									*p = filterPool{units: n, until: now + int64((valid-margin)/time.Microsecond)}
								}
							}
						}
						if !allowed {
							if ms < 2000 {
								steadyRefused++
							}
							continue
						}
						perWindow++
						if !allow(now) {
							t.Fatalf("at %d ms: admitted what the algorithm refuses (from a quota: %v)", ms, fromQuota)
						}
						if ms < 2000 && fromQuota {
							steadyQuota++
						} else if ms < 2000 {
							steadyCalled++
						}
					}
				}
			}
			// The floor: a data plane calls at least once per lease (a
			// window; for token_bucket and gcra half the capacity's refill),
			// less the margin.
			v := l.Window
			if redisstore.Returnable(l.Algorithm) {
				v = refillTime(l) / 2
			}
			calls := float64(len(pools)) * 2 * float64(time.Second) / float64(v-margin)
			ceiling := 1 - calls/float64(steadyQuota+steadyCalled)
			share := float64(steadyQuota) / float64(steadyQuota+steadyCalled)
			t.Logf("below the limit: %d admitted from quotas, %d by a call (%.1f%% in the data planes, %.2f of the %.1f%% a call per lease allows), %d refused",
				steadyQuota, steadyCalled, 100*share, share/ceiling, 100*ceiling, steadyRefused)
			if share < 0.9*ceiling {
				t.Errorf("only %.1f%% of admissions below the limit decided in the data planes, ceiling %.1f%%", 100*share, 100*ceiling)
			}
			if steadyRefused != 0 {
				t.Errorf("%d refused at half the limit: leases or quotas held what others needed", steadyRefused)
			}
		})
	}
}

// slowLeaser is a Redis store whose lease calls are answered late: each
// debits its units in Redis at once, then holds the answer until release
// is closed or the call's context ends (as a slow network would).
type slowLeaser struct {
	Leaser
	started chan struct{} // closed by the first lease call
	release chan struct{}
	once    sync.Once
	granted atomic.Int64
}

func (l *slowLeaser) Lease(ctx context.Context, reqs []redisstore.LeaseRequest, out []redisstore.Lease) error {
	if err := l.Leaser.Lease(context.Background(), reqs, out); err != nil {
		return err
	}
	for _, g := range out {
		l.granted.Add(g.Granted)
	}
	l.once.Do(func() { close(l.started) })
	select {
	case <-l.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestLateLeaseKept: a lease call answered after its check's timeout is
// not lost. The check gets a deadline error (the degrade wrapper then
// answers it), and every unit Redis debited for the lease is kept and
// spent by the next checks, without a call to Redis. Before, the call was
// cancelled with its check and the units stayed debited, unspent, until
// the window ended.
func TestLateLeaseKept(t *testing.T) {
	clk := &clock{}
	start := int64(1_700_000_000_000_000)
	clk.us.Store(start)
	srv := redistest.StartServer(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { c.Close() })
	rs, err := redisstore.New(c, redisstore.Options{Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	slow := &slowLeaser{Leaser: rs, started: make(chan struct{}), release: make(chan struct{})}
	r, err := New(slow, Options{Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	l := store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 1000, Window: time.Hour, Lease: true}
	check := []store.Check{{Key: "late", Limit: l, Cost: 1}}
	res := make([]algorithms.Result, 1)
	ctx := context.Background()
	var lateErr error
	for ms := int64(0); ; ms++ { // 1,000/s until a check asks for a lease
		clk.us.Store(start + ms*1000)
		err := r.DecideWithin(ctx, 50*time.Millisecond, check, res)
		select {
		case <-slow.started:
			lateErr = err
		default:
			if err != nil {
				t.Fatalf("check at %d ms, before any lease: %v", ms, err)
			}
			if ms > 1000 {
				t.Fatal("no lease call in 1,000 checks")
			}
			continue
		}
		break
	}
	if !errors.Is(lateErr, context.DeadlineExceeded) {
		t.Fatalf("the check whose lease is answered late: %v, want a deadline error", lateErr)
	}
	close(slow.release)
	granted := slow.granted.Load()
	deadline := time.Now().Add(10 * time.Second)
	for r.Stats().Late == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond) // the late answer is being applied
	}
	st := r.Stats()
	if granted < 2 || st.Late != granted || st.Outstanding != granted {
		t.Fatalf("Redis debited %d units for the late lease; kept %d, held %d", granted, st.Late, st.Outstanding)
	}
	for range granted {
		if err := r.Decide(ctx, check, res); err != nil || !res[0].Allowed {
			t.Fatalf("%+v %v", res[0], err)
		}
	}
	after := r.Stats()
	if after.Local-st.Local != granted || after.PerRequest != st.PerRequest || after.LeaseCalls != st.LeaseCalls {
		t.Fatalf("%d checks after the late lease: %d answered from it, %d per request, %d lease calls",
			granted, after.Local-st.Local, after.PerRequest-st.PerRequest, after.LeaseCalls-st.LeaseCalls)
	}
	t.Logf("a lease of %d units answered after its check's 50 ms timeout: all kept and spent without a call", granted)
}

// TestRefundOnLeasedKey: a leased fixed window spent to its limit, then a
// refund of 30: the refund goes to Redis (never to a lease), the next
// requests are admitted at once and leased again from what came back, and
// the window admits exactly its limit plus what was refunded, net of which
// no more than the limit.
func TestRefundOnLeasedKey(t *testing.T) {
	clk := &clock{}
	start := int64(1_700_000_000_000_000)
	clk.us.Store(start)
	r := replicas(t, 1, clk, Options{})[0]
	l := store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 100, Window: time.Second, Lease: true}
	ctx := context.Background()
	res := make([]algorithms.Result, 1)
	check := []store.Check{{Key: "fw", Limit: l, Cost: 1}}
	var admitted int64
	ms := int64(0)
	spend := func() { // 1,000/s until the window's budget is spent
		for ; ms < 900; ms++ {
			clk.us.Store(start + ms*1000)
			if err := r.Decide(ctx, check, res); err != nil {
				t.Fatal(err)
			}
			if !res[0].Allowed {
				ms++
				return
			}
			admitted++
		}
	}
	spend()
	if admitted != 100 {
		t.Fatalf("admitted %d before the first refusal, want the limit (100)", admitted)
	}
	before := r.Stats()
	if err := r.Decide(ctx, []store.Check{{Key: "fw", Limit: l, Cost: 30, Mode: store.Refund}}, res); err != nil {
		t.Fatal(err)
	}
	if !res[0].Allowed || res[0].Remaining != 30 {
		t.Fatalf("refund of 30 answered %+v, want allowed with 30 remaining", res[0])
	}
	spend()
	if admitted != 130 {
		t.Fatalf("admitted %d in the window with a refund of 30, want 130", admitted)
	}
	if after := r.Stats(); after.LeaseCalls <= before.LeaseCalls || after.Local-before.Local < 20 {
		t.Fatalf("after the refund: %d lease calls, %d answered from leases: the key was not leased again",
			after.LeaseCalls-before.LeaseCalls, after.Local-before.Local)
	}
}

// TestWindowLeftCalendar: a calendar window's lease is sized for what is
// left of its period (23 hours on the day Berlin's clocks go forward).
func TestWindowLeftCalendar(t *testing.T) {
	day, err := calendar.Of("Europe/Berlin", algorithms.UnitDay)
	if err != nil {
		t.Fatal(err)
	}
	l := store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 10, Window: 24 * time.Hour, Calendar: day}
	now := time.Date(2026, 3, 29, 0, 30, 0, 0, day.Location())
	if got := windowLeft(l, now); got != 22*time.Hour+30*time.Minute {
		t.Fatalf("window left at 00:30 on the 23-hour day: %v", got)
	}
	l = store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 10, Window: time.Minute}
	if got := windowLeft(l, time.Unix(90, 0)); got != 30*time.Second {
		t.Fatalf("window left 30 s into a minute: %v", got)
	}
}
