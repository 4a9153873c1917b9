package degrade

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/store"
	"github.com/sluicehq/sluice/controlplane/store/memory"
	redisstore "github.com/sluicehq/sluice/controlplane/store/redis"
	"github.com/sluicehq/sluice/internal/redistest"
)

// failoverClock is a replica's clock in a failover test: real time moved
// by off (Redis's TIME minus this process's clock, measured once), by a
// deliberate skew, and by jump (to reach the next window without
// sleeping).
type failoverClock struct {
	off, skew time.Duration
	jump      atomic.Int64
}

func (c *failoverClock) Now() time.Time {
	return time.Now().Add(c.off + c.skew + time.Duration(c.jump.Load()))
}

// redisNow returns Redis's TIME as estimated from this process's clock.
func (c *failoverClock) redisNow() time.Time { return time.Now().Add(c.off) }

// failoverRig is one Redis server and, per skew, a degrade.Store whose
// memory store's clock is Redis's TIME plus that skew.
type failoverRig struct {
	srv    *redistest.Server
	client *redis.Client
	window time.Duration
	end    time.Time // Redis's current window's end (Redis's TIME)
	skews  []time.Duration
	clocks []*failoverClock
	stores []*Store
	checks [][]store.Check
}

// failoverSkews are the replica clocks tried: Redis's, and skewed both
// ways by more than an hour and part of a second.
var failoverSkews = []time.Duration{0, 3*time.Hour + 400*time.Millisecond, -(2*time.Hour + 700*time.Millisecond)}

func newFailoverRig(t *testing.T) *failoverRig {
	t.Helper()
	redis.SetLogger(discard{})
	r := &failoverRig{srv: redistest.StartServer(t), skews: failoverSkews}
	r.client = redis.NewClient(&redis.Options{Addr: r.srv.Addr(), ContextTimeoutEnabled: true,
		DialTimeout: 200 * time.Millisecond, ReadTimeout: 100 * time.Millisecond, WriteTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { r.client.Close() })
	// Redis's TIME against this process's clock, to within half a round trip.
	before := time.Now()
	rt, err := r.client.Time(t.Context()).Result()
	if err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	off := rt.Sub(before.Add(after.Sub(before) / 2))
	// A window that ends long after this test does (a day or more, as
	// unit: day), so that every step before the jump lies in it.
	r.window = redistest.FarWindow(t, rt)
	w := r.window.Microseconds()
	us := rt.UnixMicro()
	r.end = time.UnixMicro(us - us%w + w)
	primary, err := redisstore.New(r.client, redisstore.Options{}) // Redis's own TIME
	if err != nil {
		t.Fatal(err)
	}
	for i, skew := range r.skews {
		c := &failoverClock{off: off, skew: skew}
		s, err := New(primary, memory.New(memory.Options{Now: c.Now}), Options{
			Probe:         func(ctx context.Context) error { return r.client.Ping(ctx).Err() },
			ProbeInterval: time.Hour, // probes are driven by the test
			Deadline:      250 * time.Millisecond,
			TrustContext:  true,
			Logger:        quiet,
			// the first failure switches: what the memory store admits
			// before the switch is not carried back (see Trip)
			Trip: Trip{Failures: 1},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		l := store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 10, Window: r.window}
		key := store.Key("failover", []store.Entry{{Key: "skew", Value: strconv.Itoa(i)}}, "l#0", algorithms.KindFixedWindow)
		r.clocks = append(r.clocks, c)
		r.stores = append(r.stores, s)
		r.checks = append(r.checks, []store.Check{{Key: key, Limit: l, Cost: 1}})
	}
	return r
}

// timedAnswer is one answer and where it says the window ends, on Redis's
// clock (as estimated when it arrived).
type timedAnswer struct {
	algorithms.Result
	end time.Time
}

// calls makes n calls of replica i and returns how many were admitted and
// the answers.
func (r *failoverRig) calls(t *testing.T, i, n int) (int, []timedAnswer) {
	t.Helper()
	var admitted int
	var answers []timedAnswer
	out := make([]algorithms.Result, 1)
	for range n {
		if err := r.stores[i].Decide(t.Context(), r.checks[i], out); err != nil {
			t.Fatal(err)
		}
		if out[0].Allowed {
			admitted++
		}
		answers = append(answers, timedAnswer{out[0], r.clocks[i].redisNow().Add(time.Duration(out[0].ResetAfter))})
	}
	return admitted, answers
}

// failoverSlack is how far a replica's view of Redis's window end may be
// off: the round trip of an answer (the seed counts from its arrival) and
// of the TIME read that measured the clocks' offset. Generous for a busy
// machine; the bug this guards against was a whole window (a day) off.
const failoverSlack = 2 * time.Second

// TestFailoverTakesOverTheWindow: the memory store takes over Redis's
// window when Redis fails, on a real redis-server: a 10-per-window key (a window of a day or more) has 6 of
// its 10 used on Redis, Redis is killed with SIGKILL, and each replica's
// memory store answers, its clock equal to Redis's TIME or skewed from it
// by hours. The memory store must go on with Redis's window: its answers
// reset when Redis's window ends, it admits the 4 the window has left (of
// 12 calls), and in the next window (reached by moving its clock, not by
// sleeping) 10 of 12. Before the fix the seeded window was the next one:
// answers said a reset up to two windows away and the next window admitted
// nothing.
func TestFailoverTakesOverTheWindow(t *testing.T) {
	r := newFailoverRig(t)
	for i := range r.stores {
		if n, _ := r.calls(t, i, 6); n != 6 {
			t.Fatalf("skew %v: Redis admitted %d of 6", r.skews[i], n)
		}
	}
	r.srv.Kill()
	for i, skew := range r.skews {
		n, answers := r.calls(t, i, 12)
		var worst time.Duration
		for _, a := range answers {
			off := a.end.Sub(r.end)
			if off.Abs() > worst.Abs() {
				worst = off
			}
			if a.ResetAfter <= 0 || off.Abs() > failoverSlack {
				t.Errorf("skew %v: an answer resets after %v, at %v on Redis's clock: %v from the end of Redis's window (window %v)",
					skew, time.Duration(a.ResetAfter), a.end.UTC(), off, r.window)
				break
			}
		}
		t.Logf("skew %v: rest of the window: %d of 12 admitted (want 4), reset at Redis's window end %+v (window %v)", skew, n, worst, r.window)
		if n != 4 {
			t.Errorf("skew %v: %d of 12 admitted in the rest of Redis's window, want the 4 left", skew, n)
		}
		if !r.stores[i].Degraded() {
			t.Errorf("skew %v: not degraded with Redis killed", skew)
		}
		// 1 s into the next window, on the replica's clock
		c := r.clocks[i]
		c.jump.Store(int64(r.end.Add(time.Second).Sub(c.redisNow())))
		n, _ = r.calls(t, i, 12)
		t.Logf("skew %v: next window: %d of 12 admitted (want 10)", skew, n)
		if n != 10 {
			t.Errorf("skew %v: %d of 12 admitted in the next window, want the whole limit of 10", skew, n)
		}
	}
}

// TestFailoverCarriesBackToTheWindow is the way back on a real
// redis-server: 6 of 10 used on Redis, Redis killed, 2 more admitted by
// each replica's memory store (clock equal to Redis's TIME or skewed by
// hours), Redis restarted empty and the replica back on it. Redis must
// then hold the 8 in its current window (not the next one), answer the
// reset of that window, and admit the 2 left.
func TestFailoverCarriesBackToTheWindow(t *testing.T) {
	r := newFailoverRig(t)
	for i := range r.stores {
		if n, _ := r.calls(t, i, 6); n != 6 {
			t.Fatalf("skew %v: Redis admitted %d of 6", r.skews[i], n)
		}
	}
	r.srv.Kill()
	for i := range r.stores {
		if n, _ := r.calls(t, i, 2); n != 2 {
			t.Fatalf("skew %v: memory admitted %d of 2", r.skews[i], n)
		}
	}
	r.srv.Restart()
	w := r.window.Microseconds()
	for i, skew := range r.skews {
		if !r.stores[i].ProbeOnce(t.Context()) || r.stores[i].Degraded() {
			t.Fatalf("skew %v: not back on Redis after a good probe", skew)
		}
		key := r.checks[i][0].Key
		h, err := r.client.HGetAll(t.Context(), key).Result()
		if err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("%d:%d", r.end.UnixMicro()-w, w)
		t.Logf("skew %v: Redis holds %v after the carry (%v keys carried); its current window is %s", skew, h, value(t, r.stores[i].Metrics().Carried), want)
		if len(h) != 1 || h[want] != "8" {
			var got []string
			for f, v := range h {
				s, _, _ := strings.Cut(f, ":")
				us, _ := strconv.ParseInt(s, 10, 64)
				got = append(got, fmt.Sprintf("%s=%s (window %v after Redis's current one)", f, v, time.Duration(us*1000-(r.end.UnixNano()-int64(r.window)))))
			}
			t.Errorf("skew %v: Redis holds %v after the carry, want %s=8 (its current window)", skew, got, want)
		}
		n, answers := r.calls(t, i, 3)
		if n != 2 {
			t.Errorf("skew %v: Redis admitted %d of 3 after the carry, want the 2 left", skew, n)
		}
		if off := answers[0].end.Sub(r.end); off.Abs() > failoverSlack {
			t.Errorf("skew %v: Redis's answer resets after %v: %v from the end of its window", skew, time.Duration(answers[0].ResetAfter), off)
		}
	}
}
