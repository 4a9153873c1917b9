package redisstore

import (
	"context"
	"fmt"
	"math"
	"math/rand"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/store"
	"github.com/sluicehq/sluice/internal/redistest"
)

// algs lists every algorithm the store decides.
var algs = []algorithms.Kind{algorithms.KindFixedWindow, algorithms.KindSlidingWindow, algorithms.KindSlidingLog, algorithms.KindTokenBucket, algorithms.KindGCRA, algorithms.KindReserve}

// startClient starts a redis-server for the test and returns a client of it.
func startClient(t testing.TB) (*redistest.Server, *redis.Client) {
	t.Helper()
	srv := redistest.StartServer(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { c.Close() })
	return srv, c
}

// newStore returns a Store on client, failing the test on error.
func newStore(t testing.TB, client redis.UniversalClient, opts Options) *Store {
	t.Helper()
	s, err := New(client, opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// clock is an injectable time, in microseconds.
type clock struct{ us atomic.Int64 }

func (c *clock) Now() time.Time     { return time.UnixMicro(c.us.Load()) }
func (c *clock) set(us int64)       { c.us.Store(us) }
func (c *clock) get() int64         { return c.us.Load() }
func (c *clock) add(d int64)        { c.us.Add(d) }
func newClock(us int64) *clock      { c := &clock{}; c.set(us); return c }
func micros(us int64) time.Duration { return time.Duration(us) * time.Microsecond }

// oracle runs the Go algorithm a store.Limit names, with its own state, in
// whatever unit the caller passes (scale converts the limit's window).
type oracle struct {
	l     store.Limit
	scale time.Duration // the unit: time.Microsecond (as Redis) or time.Nanosecond
	fw    algorithms.FixedWindowState
	sw    algorithms.SlidingWindowState
	sl    *algorithms.SlidingLogState
	tb    algorithms.TokenBucketState
	gc    algorithms.GCRAState
	rs    algorithms.ReserveState
}

// newOracle returns a fresh oracle for l; maxRequests sizes the sliding log
// for every limit the test may switch to.
func newOracle(l store.Limit, scale time.Duration, maxRequests int64) *oracle {
	return &oracle{l: l, scale: scale, sl: algorithms.SlidingLog{Limit: maxRequests}.NewState()}
}

// allow decides one request at now (in the oracle's unit).
func (o *oracle) allow(now, cost int64) (algorithms.Result, error) {
	return o.decide(now, cost, store.Take)
}

// decide decides one check of the given cost and mode at now (in the
// oracle's unit), on the calendar's periods around now for a calendar
// limit.
func (o *oracle) decide(now, cost int64, mode store.Mode) (algorithms.Result, error) {
	l := o.l
	w := int64(l.Window / o.scale)
	burst := l.Burst
	if burst == 0 {
		burst = l.Requests
	}
	var p *algorithms.Periods
	if l.Calendar != nil {
		ns := l.Calendar.Periods(now * int64(o.scale))
		u := int64(o.scale)
		p = &algorithms.Periods{Prev: ns.Prev / u, Start: ns.Start / u, End: ns.End / u, Next: ns.Next / u}
	}
	switch l.Algorithm {
	case algorithms.KindFixedWindow:
		return pick(algorithms.FixedWindow{Limit: l.Requests, Window: w, Aligned: true, Periods: p}, &o.fw, mode, now, cost)
	case algorithms.KindSlidingWindow:
		return pick(algorithms.SlidingWindow{Limit: l.Requests, Window: w, Periods: p}, &o.sw, mode, now, cost)
	case algorithms.KindSlidingLog:
		return pick(algorithms.SlidingLog{Limit: l.Requests, Window: w, Periods: p}, o.sl, mode, now, cost)
	case algorithms.KindTokenBucket:
		return pick(algorithms.TokenBucket{Rate: l.Requests, Period: w, Burst: burst}, &o.tb, mode, now, cost)
	case algorithms.KindGCRA:
		return pick(algorithms.GCRA{MaxBurst: burst - 1, Count: l.Requests, Period: w}, &o.gc, mode, now, cost)
	case algorithms.KindReserve:
		return pick(algorithms.Reserve{Rate: l.Requests, Period: w, Burst: burst, MaxWait: int64(l.MaxWait / o.scale)}, &o.rs, mode, now, cost)
	}
	return algorithms.Result{}, fmt.Errorf("unknown algorithm %v", l.Algorithm)
}

// limiter is what every algorithm of package algorithms offers on its state.
type limiter[S any] interface {
	Allow(s S, now, cost int64) (algorithms.Result, error)
	Probe(s S, now int64) (algorithms.Result, error)
	Charge(s S, now, cost int64) (algorithms.Result, error)
	Refund(s S, now, amount int64) (algorithms.Result, error)
}

// pick runs the function of mode.
func pick[L limiter[S], S any](lim L, s S, mode store.Mode, now, cost int64) (algorithms.Result, error) {
	switch mode {
	case store.Probe:
		return lim.Probe(s, now)
	case store.Charge:
		return lim.Charge(s, now, cost)
	case store.Refund:
		return lim.Refund(s, now, cost)
	}
	return lim.Allow(s, now, cost)
}

// randomMode returns a mode and its cost for l: mostly Take (with
// randomCost), a probe (cost 0), a charge of up to three capacities (past
// the debt ceiling at times) or a refund of up to three capacities (past
// what the limiter holds at times).
func randomMode(rng *rand.Rand, l store.Limit) (store.Mode, int64) {
	switch r := rng.Intn(100); {
	case r < 15:
		return store.Probe, 0
	case r < 35:
		return store.Charge, 1 + rng.Int63n(3*capacity(l))
	case r < 50:
		return store.Refund, rng.Int63n(3*capacity(l) + 1)
	}
	return store.Take, randomCost(rng, l)
}

// capacity returns the most one request of l may cost.
func capacity(l store.Limit) int64 {
	if (l.Algorithm == algorithms.KindTokenBucket || l.Algorithm == algorithms.KindGCRA || l.Algorithm == algorithms.KindReserve) && l.Burst > 0 {
		return l.Burst
	}
	return l.Requests
}

// logUniform returns an integer in [lo, hi], log-uniformly.
func logUniform(rng *rand.Rand, lo, hi int64) int64 {
	if lo >= hi {
		return lo
	}
	span := float64(hi) / float64(lo)
	v := int64(float64(lo) * math.Pow(span, rng.Float64()))
	return max(lo, min(hi, v))
}

// randomLimit returns a random valid limit of alg whose window is a whole
// number of microseconds (minWindow microseconds at least).
func randomLimit(rng *rand.Rand, alg algorithms.Kind, maxRequests, minWindow int64) store.Limit {
	l := store.Limit{Algorithm: alg, Requests: logUniform(rng, 1, maxRequests)}
	w := logUniform(rng, minWindow, 100_000_000_000) // up to ~28 hours
	switch alg {
	case algorithms.KindTokenBucket:
		if rng.Intn(2) == 0 {
			l.Burst = logUniform(rng, 1, 2*maxRequests)
		}
	case algorithms.KindReserve:
		if rng.Intn(2) == 0 {
			l.Burst = logUniform(rng, 1, 2*maxRequests)
		}
		// From no wait at all to several periods' worth of queue.
		if rng.Intn(8) > 0 {
			l.MaxWait = micros(logUniform(rng, 1, 4*w))
		}
	case algorithms.KindGCRA:
		if rng.Intn(2) == 0 {
			l.Burst = logUniform(rng, 1, 2*maxRequests)
		}
		if w < l.Requests { // at least one microsecond per request
			w = l.Requests + rng.Int63n(l.Requests)
		}
	}
	l.Window = micros(w)
	return l
}

// randomCost returns a cost for l: mostly 1, sometimes up to the capacity,
// rarely 0 (a peek).
func randomCost(rng *rand.Rand, l store.Limit) int64 {
	switch r := rng.Intn(100); {
	case r < 5:
		return 0
	case r < 65:
		return 1
	default:
		return 1 + rng.Int63n(capacity(l))
	}
}

// randomStep returns a clock step in microseconds: often none, mostly
// forward over many scales, backward when back is set.
func randomStep(rng *rand.Rand, back bool) int64 {
	switch r := rng.Intn(100); {
	case r < 20:
		return 0
	case r < 25 && back:
		return -logUniform(rng, 1, 10_000_000)
	default:
		return logUniform(rng, 1, 10_000_000_000)
	}
}

// sameResult reports how got (from the store, nanoseconds) differs from want
// (the Go algorithm on microseconds), or "" if it does not.
func sameResult(got, want algorithms.Result) string {
	want.RetryAfter *= 1000
	want.ResetAfter *= 1000
	want.Wait *= 1000
	if got != want {
		return fmt.Sprintf("store %+v, Go (us*1000) %+v", got, want)
	}
	return ""
}

// scriptCommands are the commands the store calls its scripts with.
var scriptCommands = []string{"evalsha", "eval", "fcall"}

// commandStats returns calls and usec of the script commands from INFO
// commandstats, summed over the given clients (the nodes of a cluster).
func commandStats(t testing.TB, clients ...*redis.Client) (calls, usec int64) {
	t.Helper()
	for _, c := range clients {
		for _, name := range scriptCommands {
			n, u := commandStat(t, c, name)
			calls, usec = calls+n, usec+u
		}
	}
	return calls, usec
}

// commandCalls returns how many times the server ran command.
func commandCalls(t testing.TB, c *redis.Client, command string) int64 {
	t.Helper()
	calls, _ := commandStat(t, c, command)
	return calls
}

// commandStat returns calls and usec of one command from INFO commandstats
// (zeros for a command the server has not run).
func commandStat(t testing.TB, c *redis.Client, command string) (calls, usec int64) {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		fields, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+command+":")
		if !ok {
			continue
		}
		for _, f := range strings.Split(fields, ",") {
			k, v, _ := strings.Cut(f, "=")
			n, _ := strconv.ParseFloat(v, 64)
			switch k {
			case "calls":
				calls = int64(n)
			case "usec":
				usec = int64(n)
			}
		}
	}
	return calls, usec
}
