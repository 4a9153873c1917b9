package redisstore

import (
	"context"
	"errors"
	"math"
	"math/rand"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/store"
)

// TestInvalidChecks: every limit the scripts cannot decide exactly is refused
// before any I/O, with an error that wraps store.ErrInvalidLimit and names
// the field.
func TestInvalidChecks(t *testing.T) {
	// No server: validation must not need one.
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer client.Close()
	s := newStore(t, client, Options{})
	fw := func(req int64, w time.Duration) store.Limit {
		return store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: req, Window: w}
	}
	lim := func(a algorithms.Kind, req int64, w time.Duration, burst int64) store.Limit {
		return store.Limit{Algorithm: a, Requests: req, Window: w, Burst: burst}
	}
	cases := []struct {
		name  string
		check store.Check
		field string
	}{
		{"empty key", store.Check{Key: "", Limit: fw(1, time.Second), Cost: 1}, "key"},
		{"unknown algorithm", store.Check{Key: "k", Limit: store.Limit{Algorithm: 99, Requests: 1, Window: time.Second}}, "algorithm"},
		{"zero algorithm", store.Check{Key: "k", Limit: store.Limit{Requests: 1, Window: time.Second}}, "algorithm"},
		{"zero requests", store.Check{Key: "k", Limit: fw(0, time.Second), Cost: 1}, "limit"},
		{"negative requests", store.Check{Key: "k", Limit: fw(-5, time.Second), Cost: 1}, "limit"},
		{"huge requests", store.Check{Key: "k", Limit: fw(math.MaxInt64, time.Second), Cost: 1}, "requests"},
		{"zero window", store.Check{Key: "k", Limit: fw(1, 0), Cost: 1}, "window"},
		{"negative window", store.Check{Key: "k", Limit: fw(1, -time.Second), Cost: 1}, "window"},
		{"sub-microsecond window", store.Check{Key: "k", Limit: fw(1, 1500*time.Nanosecond), Cost: 1}, "window"},
		{"max window", store.Check{Key: "k", Limit: fw(1, math.MaxInt64), Cost: 1}, "window"},
		{"window beyond 2^50 us", store.Check{Key: "k", Limit: fw(1, micros(1<<50+1)), Cost: 1}, "window"},
		{"sliding window too long", store.Check{Key: "k", Limit: lim(algorithms.KindSlidingWindow, 1, micros(1<<43), 0), Cost: 1}, "window"},
		{"sliding window limit too large", store.Check{Key: "k", Limit: lim(algorithms.KindSlidingWindow, 1<<41, time.Second, 0), Cost: 1}, "requests"},
		{"negative burst", store.Check{Key: "k", Limit: lim(algorithms.KindTokenBucket, 1, time.Second, -1), Cost: 1}, "burst"},
		{"min burst", store.Check{Key: "k", Limit: lim(algorithms.KindGCRA, 1, time.Second, math.MinInt64), Cost: 1}, "burst"},
		{"token bucket burst*period too large", store.Check{Key: "k", Limit: lim(algorithms.KindTokenBucket, 1, time.Hour, 1<<28), Cost: 1}, "burst"},
		{"token bucket rate too large", store.Check{Key: "k", Limit: lim(algorithms.KindTokenBucket, 1<<51, time.Second, 1), Cost: 1}, "requests"},
		{"gcra count above period", store.Check{Key: "k", Limit: lim(algorithms.KindGCRA, 2_000_000, time.Second, 0), Cost: 1}, "count"},
		{"gcra tolerance too large", store.Check{Key: "k", Limit: lim(algorithms.KindGCRA, 1, time.Hour, 1<<28), Cost: 1}, "burst"},
		{"negative cost", store.Check{Key: "k", Limit: fw(5, time.Second), Cost: -1}, "cost"},
		{"cost above capacity", store.Check{Key: "k", Limit: fw(5, time.Second), Cost: 6}, "cost"},
		{"cost above burst", store.Check{Key: "k", Limit: lim(algorithms.KindTokenBucket, 100, time.Second, 3), Cost: 4}, "cost"},
		{"huge cost", store.Check{Key: "k", Limit: lim(algorithms.KindGCRA, 1, time.Second, 0), Cost: math.MaxInt64}, "cost"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ok := store.Check{Key: "fine", Limit: fw(1, time.Second), Cost: 1}
			start := time.Now()
			err := s.Decide(context.Background(), []store.Check{ok, c.check}, make([]algorithms.Result, 2))
			if err == nil {
				t.Fatal("no error")
			}
			if time.Since(start) > time.Second {
				t.Errorf("took %v: validation must not wait for the (absent) server", time.Since(start))
			}
			var le *algorithms.LimitError
			if !errors.Is(err, store.ErrInvalidLimit) || !errors.As(err, &le) {
				t.Fatalf("%v: does not wrap store.ErrInvalidLimit and an *algorithms.LimitError", err)
			}
			if le.Field != c.field {
				t.Errorf("%v: field %q, want %q", err, le.Field, c.field)
			}
			if !strings.Contains(err.Error(), "check 1") {
				t.Errorf("%v: does not name the check", err)
			}
		})
	}
}

// TestLargestLimitsAccepted: the bounds refuse only what they must; limits
// just inside them decide correctly on the real server.
func TestLargestLimitsAccepted(t *testing.T) {
	_, client := startClient(t)
	s := newStore(t, client, Options{})
	checks := []store.Check{
		{Key: "a", Limit: store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 1 << 50, Window: micros(1 << 50)}, Cost: 1 << 50},
		{Key: "b", Limit: store.Limit{Algorithm: algorithms.KindSlidingLog, Requests: 1 << 50, Window: micros(1 << 50)}, Cost: 1 << 49},
		{Key: "c", Limit: store.Limit{Algorithm: algorithms.KindSlidingWindow, Requests: (1 << 50) / 1000, Window: micros(4 * (1 << 50) / 1000)}, Cost: 7},
		{Key: "d", Limit: store.Limit{Algorithm: algorithms.KindTokenBucket, Requests: 1 << 50, Window: micros(1 << 20), Burst: 1 << 30}, Cost: 1 << 30},
		{Key: "e", Limit: store.Limit{Algorithm: algorithms.KindGCRA, Requests: 1, Window: micros(1 << 20), Burst: 1 << 30}, Cost: 1<<30 - 1},
	}
	out := make([]algorithms.Result, len(checks))
	if err := s.Decide(context.Background(), checks, out); err != nil {
		t.Fatal(err)
	}
	want := []int64{0, 1 << 49, (1<<50)/1000 - 7, 0, 1}
	for i, r := range out {
		if !r.Allowed || r.Remaining != want[i] {
			t.Errorf("check %d (%s): %+v, want allowed with %d remaining", i, checks[i].Limit.Algorithm, r, want[i])
		}
	}
}

// TestNew covers the constructor's refusals and defaults.
func TestNew(t *testing.T) {
	if _, err := New(nil, Options{}); err == nil {
		t.Error("nil client accepted")
	}
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer client.Close()
	if _, err := New(client, Options{MaxBatch: -1}); err == nil || !strings.Contains(err.Error(), "MaxBatch") {
		t.Errorf("negative MaxBatch: %v", err)
	}
	if _, err := New(client, Options{MaxInFlight: -1}); err == nil || !strings.Contains(err.Error(), "MaxInFlight") {
		t.Errorf("negative MaxInFlight: %v", err)
	}
	s := newStore(t, client, Options{})
	if s.maxBatch != DefaultMaxBatch || s.maxInFlight != DefaultMaxInFlight || !s.single || s.Name() != "redis" {
		t.Errorf("defaults: %+v", s)
	}
	if err := s.Decide(context.Background(), nil, nil); err != nil {
		t.Errorf("no checks: %v", err)
	}
	if err := s.Decide(context.Background(), make([]store.Check, 2), make([]algorithms.Result, 1)); err == nil {
		t.Error("len(out) != len(checks) accepted")
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	ok := store.Check{Key: "k", Limit: store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 1, Window: time.Second}, Cost: 1}
	if err := s.Decide(cancelled, []store.Check{ok}, make([]algorithms.Result, 1)); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: %v", err)
	}
}

// TestHashTag follows Redis Cluster's rule: the first '{', the next '}', and
// something between them.
func TestHashTag(t *testing.T) {
	for _, c := range []struct{ key, tag string }{
		{"sluice:{abc}", "abc"},
		{"{a}{b}", "a"},
		{"x{}y{z}", "x{}y{z}"},
		{"x{y", "x{y"},
		{"x}y{z}", "z"},
		{"plain", "plain"},
		{"", ""},
		{"{{a}}", "{a"},
	} {
		if got := hashTag(c.key); got != c.tag {
			t.Errorf("hashTag(%q) = %q, want %q", c.key, got, c.tag)
		}
	}
}

// TestFunctions: the store loads its function library and calls it with
// FCALL; after FUNCTION FLUSH the next call runs the script with EVAL, the
// state intact, and the library is loaded again. A second store (another
// instance of the same version) finds the library there. With NoFunctions
// nothing is loaded and every call is an EVALSHA.
func TestFunctions(t *testing.T) {
	_, client := startClient(t)
	ctx := context.Background()
	s := newStore(t, client, Options{})
	if err := s.loadFunctions(ctx); err != nil {
		t.Fatal(err)
	}
	if err := newStore(t, client, Options{}).loadFunctions(ctx); err != nil {
		t.Fatalf("loading the library a second time: %v", err)
	}
	l := store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 10, Window: time.Hour}
	checks := []store.Check{{Key: "a", Limit: l, Cost: 1}, {Key: "b", Limit: l, Cost: 2}}
	out := make([]algorithms.Result, 2)
	decide := func(round int) {
		t.Helper()
		if err := s.Decide(ctx, checks, out); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if out[0].Remaining != int64(10-(round+1)) || out[1].Remaining != int64(10-2*(round+1)) {
			t.Fatalf("round %d: %+v: the state did not survive", round, out)
		}
	}
	decide(0)
	decide(1)
	if n := commandCalls(t, client, "fcall"); n != 2 {
		t.Fatalf("%d FCALLs, want 2", n)
	}
	if err := client.FunctionFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	decide(2)
	if n := commandCalls(t, client, "eval"); n != 1 {
		t.Fatalf("after FUNCTION FLUSH: %d EVALs, want 1", n)
	}
	if s.functions.Load() {
		t.Fatal("after FUNCTION FLUSH the store still calls the function")
	}
	if err := s.loadFunctions(ctx); err != nil {
		t.Fatal(err)
	}
	decide(3)
	if n := commandCalls(t, client, "fcall"); n != 4 { // two, the one FLUSH failed, this one
		t.Fatalf("%d FCALLs, want 4", n)
	}

	_, other := startClient(t)
	s = newStore(t, other, Options{NoFunctions: true})
	for range 3 {
		if err := s.Decide(ctx, checks, out); err != nil {
			t.Fatal(err)
		}
	}
	if libs, err := other.FunctionList(ctx, redis.FunctionListQuery{}).Result(); err != nil || len(libs) != 0 {
		t.Errorf("NoFunctions: libraries %v (%v), want none", libs, err)
	}
	if n := commandCalls(t, other, "evalsha"); n != 3 {
		t.Errorf("NoFunctions: %d EVALSHAs, want 3", n)
	}
}

// TestCheckReply: replies without dispatch.lua's layout are refused before
// anything is read from them.
func TestCheckReply(t *testing.T) {
	for _, c := range []struct {
		vals   []int64
		checks int
		ok     bool
	}{
		{[]int64{5, 1, 2}, 2, true},                          // two short answers
		{[]int64{0, -1, 0, 3, 7, 7}, 1, true},                // one long answer
		{[]int64{5, -2, 4, 1, 9, 0, 0, 0, 3, 4, 5}, 2, true}, // second long answer
		{[]int64{5, -2, 4, 1, 9, 0, 0}, 2, false},            // long answer 2 of 1
		{[]int64{5, 1}, 2, false},                            // short of answers
		{[]int64{5, 1, 2, 3}, 2, false},                      // a partial long answer
		{nil, 0, false},                                      // no R
		{[]int64{0}, 0, true},                                // no checks
	} {
		err := checkReply(c.vals, c.checks)
		if (err == nil) != c.ok {
			t.Errorf("checkReply(%v, %d) = %v, want ok %v", c.vals, c.checks, err, c.ok)
		}
	}
}

// TestExpiry: every written key gets a TTL at the moment its state is fresh
// again (ceil of the reset time in ms, plus 1); with an injected clock, a day
// more.
func TestExpiry(t *testing.T) {
	_, client := startClient(t)
	ctx := context.Background()
	limits := map[algorithms.Kind]store.Limit{
		algorithms.KindFixedWindow:   {Algorithm: algorithms.KindFixedWindow, Requests: 5, Window: 10 * time.Second},
		algorithms.KindSlidingWindow: {Algorithm: algorithms.KindSlidingWindow, Requests: 5, Window: 10 * time.Second},
		algorithms.KindSlidingLog:    {Algorithm: algorithms.KindSlidingLog, Requests: 5, Window: 10 * time.Second},
		algorithms.KindTokenBucket:   {Algorithm: algorithms.KindTokenBucket, Requests: 5, Window: 10 * time.Second},
		algorithms.KindGCRA:          {Algorithm: algorithms.KindGCRA, Requests: 5, Window: 10 * time.Second},
		algorithms.KindReserve:       {Algorithm: algorithms.KindReserve, Requests: 5, Window: 10 * time.Second, MaxWait: time.Second},
	}
	for _, injected := range []bool{false, true} {
		var opts Options
		if injected {
			opts.Now = newClock(1_700_000_000_123_456).Now
		}
		s := newStore(t, client, opts)
		for _, alg := range algs {
			key := keyName("expiry-"+strconv.FormatBool(injected), int(alg))
			out := make([]algorithms.Result, 1)
			if err := s.Decide(ctx, []store.Check{{Key: key, Limit: limits[alg], Cost: 2}}, out); err != nil {
				t.Fatal(err)
			}
			ttl, err := client.PTTL(ctx, key).Result()
			if err != nil {
				t.Fatal(err)
			}
			most := time.Duration(roundUpMilli(out[0].ResetAfter)) + time.Millisecond
			least := most - 5*time.Second // generous for a slow machine
			if injected {
				most += 24 * time.Hour
				least += 24 * time.Hour
			}
			if ttl <= least || ttl > most {
				t.Errorf("%s (injected clock %v): PTTL %v, reset after %v: want in (%v, %v]", alg, injected, ttl, time.Duration(out[0].ResetAfter), least, most)
			}
		}
	}
}

// roundUpMilli rounds nanoseconds up to whole milliseconds.
func roundUpMilli(ns int64) int64 { return (ns + 999_999) / 1_000_000 * 1_000_000 }

// TestDeniedWritesNothing: a denial leaves the key byte for byte as it was,
// and does not extend its life.
func TestDeniedWritesNothing(t *testing.T) {
	_, client := startClient(t)
	ctx := context.Background()
	s := newStore(t, client, Options{})
	for _, alg := range algs {
		key := keyName("denied", int(alg))
		l := store.Limit{Algorithm: alg, Requests: 3, Window: time.Hour}
		out := make([]algorithms.Result, 1)
		fill := 3
		if alg == algorithms.KindReserve {
			fill = 4 // with no wait allowed, the 4th pays later, as in Guava
		}
		for range fill {
			if err := s.Decide(ctx, []store.Check{{Key: key, Limit: l, Cost: 1}}, out); err != nil || !out[0].Allowed {
				t.Fatalf("%s: filling: %+v, %v", alg, out[0], err)
			}
		}
		before, err := client.Dump(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		ttlBefore := client.PTTL(ctx, key).Val()
		for range 5 {
			if err := s.Decide(ctx, []store.Check{{Key: key, Limit: l, Cost: 1}}, out); err != nil || out[0].Allowed {
				t.Fatalf("%s: over the limit: %+v, %v", alg, out[0], err)
			}
			if out[0].RetryAfter <= 0 {
				t.Errorf("%s: denied without a retry-after: %+v", alg, out[0])
			}
		}
		after := client.Dump(ctx, key).Val()
		if after != before {
			t.Errorf("%s: a denial changed the state", alg)
		}
		if ttl := client.PTTL(ctx, key).Val(); ttl > ttlBefore {
			t.Errorf("%s: a denial extended the TTL from %v to %v", alg, ttlBefore, ttl)
		}
	}
}

// TestPeekOnFreshKeyLeavesNothing: a cost-0 check on an idle fixed or
// sliding window (the common limits) creates no key. A fixed window
// answers the time until it ends (as envoyproxy/ratelimit does); the
// others are full now.
func TestPeekOnFreshKeyLeavesNothing(t *testing.T) {
	_, client := startClient(t)
	ctx := context.Background()
	s := newStore(t, client, Options{})
	for _, alg := range []algorithms.Kind{algorithms.KindFixedWindow, algorithms.KindSlidingWindow, algorithms.KindSlidingLog} {
		key := keyName("peek", int(alg))
		out := make([]algorithms.Result, 1)
		l := store.Limit{Algorithm: alg, Requests: 4, Window: time.Minute}
		if err := s.Decide(ctx, []store.Check{{Key: key, Limit: l}}, out); err != nil {
			t.Fatal(err)
		}
		reset := out[0].ResetAfter == 0
		if alg == algorithms.KindFixedWindow {
			reset = out[0].ResetAfter > 0 && out[0].ResetAfter <= int64(time.Minute)
		}
		if !out[0].Allowed || out[0].Remaining != 4 || !reset {
			t.Errorf("%s: peek on a fresh key: %+v", alg, out[0])
		}
		if n := client.Exists(ctx, key).Val(); n != 0 {
			t.Errorf("%s: a peek created the key", alg)
		}
	}
}

// TestNoScript: after SCRIPT FLUSH the next call loads the script again
// (EVAL) and the state is intact.
func TestNoScript(t *testing.T) {
	_, client := startClient(t)
	ctx := context.Background()
	s := newStore(t, client, Options{NoFunctions: true})
	l := store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 10, Window: time.Hour}
	checks := []store.Check{{Key: "a", Limit: l, Cost: 1}, {Key: "b", Limit: l, Cost: 2}}
	out := make([]algorithms.Result, 2)
	for round := range 4 {
		if round == 2 {
			if err := client.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Decide(ctx, checks, out); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if out[0].Remaining != int64(10-(round+1)) || out[1].Remaining != int64(10-2*(round+1)) {
			t.Fatalf("round %d: %+v: the state did not survive SCRIPT FLUSH", round, out)
		}
	}
	if ok, err := client.ScriptExists(ctx, scriptSHA).Result(); err != nil || !ok[0] {
		t.Errorf("script not cached again after the EVAL: %v %v", ok, err)
	}
}

// TestCorruptState: a key that holds something sluice did not write fails
// only the calls that use it, with an error naming the key, writes nothing,
// and never fails the other calls sharing its script call.
func TestCorruptState(t *testing.T) {
	_, client := startClient(t)
	ctx := context.Background()
	cases := []struct {
		alg   algorithms.Kind
		setup func(key string) error
	}{
		{algorithms.KindFixedWindow, func(k string) error { return client.Set(ctx, k, "garbage", 0).Err() }},
		{algorithms.KindFixedWindow, func(k string) error { return client.Set(ctx, k, "99999999999999999999:1", 0).Err() }},
		{algorithms.KindFixedWindow, func(k string) error { return client.Set(ctx, k, "-5:1", 0).Err() }},
		{algorithms.KindFixedWindow, func(k string) error { return client.HSet(ctx, k, "f", "v").Err() }},
		{algorithms.KindFixedWindow, func(k string) error { return client.HSet(ctx, k, "5:3600000000", "x").Err() }},
		{algorithms.KindFixedWindow, func(k string) error { return client.HSet(ctx, k, "5:3600000000", "1", "6:3600000000", "1").Err() }},
		{algorithms.KindFixedWindow, func(k string) error { return client.LPush(ctx, k, "x").Err() }},
		{algorithms.KindSlidingWindow, func(k string) error { return client.Set(ctx, k, "1:2", 0).Err() }},
		{algorithms.KindTokenBucket, func(k string) error { return client.LPush(ctx, k, "x").Err() }},
		{algorithms.KindTokenBucket, func(k string) error { return client.Set(ctx, k, "garbage", 0).Err() }},
		{algorithms.KindTokenBucket, func(k string) error { return client.Set(ctx, k, "1:99999999999999999999", 0).Err() }},
		{algorithms.KindReserve, func(k string) error { return client.Set(ctx, k, "99999999999999999999:1", 0).Err() }},
		{algorithms.KindReserve, func(k string) error { return client.Set(ctx, k, "1:x", 0).Err() }},
		{algorithms.KindGCRA, func(k string) error { return client.Set(ctx, k, "1e300", 0).Err() }},
		{algorithms.KindGCRA, func(k string) error { return client.HSet(ctx, k, "f", "v").Err() }},
		{algorithms.KindSlidingLog, func(k string) error { return client.Set(ctx, k, "5", 0).Err() }},
		{algorithms.KindSlidingLog, func(k string) error { return client.ZAdd(ctx, k, redis.Z{Score: 1, Member: "1:1"}).Err() }},
		{algorithms.KindSlidingLog, func(k string) error {
			return client.ZAdd(ctx, k, redis.Z{Score: -3, Member: "#"}, redis.Z{Score: 1, Member: "junk"}).Err()
		}},
		{algorithms.KindSlidingLog, func(k string) error {
			// the total says 10, the entries hold 1: the retry-after search
			// runs out of entries
			return client.ZAdd(ctx, k, redis.Z{Score: -11, Member: "#"}, redis.Z{Score: float64(time.Now().UnixMicro()), Member: strconv.FormatInt(time.Now().UnixMicro(), 10) + ":1"}).Err()
		}},
	}
	s := newStore(t, client, Options{MaxInFlight: 1})
	for i, c := range cases {
		bad := keyName("corrupt", i)
		if err := c.setup(bad); err != nil {
			t.Fatal(err)
		}
		before := client.Dump(ctx, bad).Val()
		l := store.Limit{Algorithm: c.alg, Requests: 5, Window: time.Hour}
		// Several concurrent calls, so some share a script call with the
		// bad one.
		var wg sync.WaitGroup
		errs := make([]error, 8)
		for j := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				key := keyName("fine", i*100+j)
				if j == 3 {
					key = bad
				}
				errs[j] = s.Decide(ctx, []store.Check{{Key: key, Limit: l, Cost: 1}}, make([]algorithms.Result, 1))
			}()
		}
		wg.Wait()
		for j, err := range errs {
			if j == 3 {
				if err == nil || !strings.Contains(err.Error(), "did not write") || !strings.Contains(err.Error(), bad) {
					t.Errorf("case %d (%s): bad key: %v", i, c.alg, err)
				}
			} else if err != nil {
				t.Errorf("case %d (%s): a call on a good key failed: %v", i, c.alg, err)
			}
		}
		if after := client.Dump(ctx, bad).Val(); after != before {
			t.Errorf("case %d (%s): the corrupt key was written", i, c.alg)
		}
	}
}

// TestHostileKeysAndManyChecks: keys with any bytes are just keys; a call
// with 10,000 checks is split into script calls of MaxBatch and answered in
// full.
func TestHostileKeysAndManyChecks(t *testing.T) {
	_, client := startClient(t)
	ctx := context.Background()
	s := newStore(t, client, Options{MaxBatch: 256})
	l := store.Limit{Algorithm: algorithms.KindSlidingWindow, Requests: 2, Window: time.Minute}
	hostile := []string{"{", "}", "{}", "a:b:c", "new\nline", "nul\x00byte", strings.Repeat("x", 64<<10), "#", "ARGV[1]", "'); redis.call('FLUSHALL') --"}
	var checks []store.Check
	for _, k := range hostile {
		checks = append(checks, store.Check{Key: k, Limit: l, Cost: 1})
	}
	for i := len(checks); i < 10_000; i++ {
		checks = append(checks, store.Check{Key: keyName("many", i), Limit: l, Cost: 1})
	}
	// Load the script first: on a fresh server each script call would fail
	// with NOSCRIPT once and count twice.
	if err := client.ScriptLoad(ctx, scriptSource).Err(); err != nil {
		t.Fatal(err)
	}
	callsBefore, _ := commandStats(t, client)
	out := make([]algorithms.Result, len(checks))
	if err := s.Decide(ctx, checks, out); err != nil {
		t.Fatal(err)
	}
	callsAfter, _ := commandStats(t, client)
	if got, want := callsAfter-callsBefore, int64((len(checks)+255)/256); got != want {
		t.Errorf("%d script calls for %d checks, want %d", got, len(checks), want)
	}
	for i, r := range out {
		if !r.Allowed || r.Remaining != 1 {
			t.Fatalf("check %d: %+v", i, r)
		}
	}
	for _, k := range hostile {
		if client.Exists(ctx, k).Val() != 1 {
			t.Errorf("key %.20q was not written as itself", k)
		}
	}
	if n := client.DBSize(ctx).Val(); n != int64(len(checks)) {
		t.Errorf("%d keys in Redis, want %d", n, len(checks))
	}
}

// TestDeadline: a call whose context ends while Redis does not answer
// returns promptly with the context's error.
func TestDeadline(t *testing.T) {
	_, client := startClient(t)
	ctx := context.Background()
	s := newStore(t, client, Options{})
	check := store.Check{Key: "k", Limit: store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 5, Window: time.Hour}, Cost: 1}
	out := make([]algorithms.Result, 1)
	if err := s.Decide(ctx, []store.Check{check}, out); err != nil { // connect first
		t.Fatal(err)
	}
	// Redis holds every command (CLIENT UNPAUSE too) for a second.
	if err := client.Do(ctx, "CLIENT", "PAUSE", "1000", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	defer client.Ping(ctx) // returns when the pause is over
	dctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := s.Decide(dctx, []store.Check{check}, out)
	took := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want context.DeadlineExceeded", err)
	}
	if took > 600*time.Millisecond {
		t.Errorf("returned after %v, the deadline was 100ms", took)
	}
}

// TestDecideWithin: a call not decided within its timeout (Redis paused)
// returns promptly with context.DeadlineExceeded; answered calls are not
// affected by the timeout; a timeout that is not positive is refused.
func TestDecideWithin(t *testing.T) {
	_, client := startClient(t)
	ctx := context.Background()
	s := newStore(t, client, Options{})
	check := store.Check{Key: "k", Limit: store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 5, Window: time.Hour}, Cost: 1}
	out := make([]algorithms.Result, 1)
	for range 3 { // the pooled timers are reused
		if err := s.DecideWithin(ctx, time.Second, []store.Check{check}, out); err != nil || !out[0].Allowed {
			t.Fatalf("%+v, %v", out[0], err)
		}
	}
	if err := s.DecideWithin(ctx, 0, []store.Check{check}, out); err == nil {
		t.Error("a zero timeout was accepted")
	}
	if err := client.Do(ctx, "CLIENT", "PAUSE", "1000", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	defer client.Ping(ctx) // returns when the pause is over
	start := time.Now()
	err := s.DecideWithin(ctx, 100*time.Millisecond, []store.Check{check}, out)
	took := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want context.DeadlineExceeded", err)
	}
	if took > 600*time.Millisecond {
		t.Errorf("returned after %v, the timeout was 100ms", took)
	}
}

// TestAbandonedCallsAreNotSent: calls still queued when their callers give up
// are never sent, so they take nothing.
func TestAbandonedCallsAreNotSent(t *testing.T) {
	_, client := startClient(t)
	ctx := context.Background()
	s := newStore(t, client, Options{MaxInFlight: 1})
	check := store.Check{Key: "k", Limit: store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 100, Window: time.Hour}, Cost: 1}
	if err := s.Decide(ctx, []store.Check{check}, make([]algorithms.Result, 1)); err != nil {
		t.Fatal(err)
	}
	admin := redis.NewClient(&redis.Options{Addr: client.Options().Addr})
	defer admin.Close()
	// Redis holds every command (CLIENT UNPAUSE too) for 1.5 s.
	if err := admin.Do(ctx, "CLIENT", "PAUSE", "1500", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	// The first call takes the only round-trip slot and stalls in Redis.
	first := make(chan error, 1)
	go func() {
		c, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		first <- s.Decide(c, []store.Check{check}, make([]algorithms.Result, 1))
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		s.mu.Lock()
		busy := s.inFlight == 1
		s.mu.Unlock()
		if busy {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first call never started its round trip")
		}
		time.Sleep(time.Millisecond) // polling for a goroutine to start
	}
	// These queue behind it and give up.
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			if i%2 == 0 { // half give up by their context, half by DecideWithin's timeout
				c, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
				defer cancel()
				err = s.Decide(c, []store.Check{check}, make([]algorithms.Result, 1))
			} else {
				err = s.DecideWithin(ctx, 50*time.Millisecond, []store.Check{check}, make([]algorithms.Result, 1))
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("queued call: %v", err)
			}
		}()
	}
	wg.Wait()
	if err := <-first; !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("first call: %v", err)
	}
	if err := admin.Ping(ctx).Err(); err != nil { // returns when the pause is over
		t.Fatal(err)
	}
	out := make([]algorithms.Result, 1)
	peek := check
	peek.Cost = 0
	if err := s.Decide(ctx, []store.Check{peek}, out); err != nil {
		t.Fatal(err)
	}
	// The warm-up and the stalled first call counted; the ten queued did not.
	if out[0].Remaining != 98 {
		t.Errorf("remaining %d, want 98", out[0].Remaining)
	}
}

// TestBatching: concurrent calls share script calls when round trips are
// busy, and each still gets its own results.
func TestBatching(t *testing.T) {
	_, client := startClient(t)
	ctx := context.Background()
	s := newStore(t, client, Options{MaxInFlight: 1, MaxBatch: 64})
	const callers, per = 64, 30
	l := store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: per, Window: time.Hour}
	callsBefore, _ := commandStats(t, client)
	var wg sync.WaitGroup
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each caller has its own key, and a second check on a shared one.
			mine := store.Check{Key: keyName("batch", c), Limit: l, Cost: 1}
			shared := store.Check{Key: "batch-shared", Limit: store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 1 << 20, Window: time.Hour}, Cost: 1}
			out := make([]algorithms.Result, 2)
			for i := range per {
				if err := s.Decide(ctx, []store.Check{mine, shared}, out); err != nil {
					t.Error(err)
					return
				}
				if !out[0].Allowed || out[0].Remaining != int64(per-1-i) || out[0].Limit != per || !out[1].Allowed {
					t.Errorf("caller %d call %d: %+v", c, i, out)
					return
				}
			}
		}()
	}
	wg.Wait()
	callsAfter, _ := commandStats(t, client)
	calls := callsAfter - callsBefore
	if calls*4 > callers*per {
		t.Errorf("%d script calls for %d Decide calls: concurrent calls are not batched", calls, callers*per)
	}
	remaining := make([]algorithms.Result, 1)
	peek := store.Check{Key: "batch-shared", Limit: store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 1 << 20, Window: time.Hour}}
	if err := s.Decide(ctx, []store.Check{peek}, remaining); err != nil {
		t.Fatal(err)
	}
	if got := 1<<20 - remaining[0].Remaining; got != callers*per {
		t.Errorf("shared key counted %d, want %d", got, callers*per)
	}
	t.Logf("%d Decide calls in %d script calls", callers*per, calls)
}

// TestInjectedTimeOutOfRange: an injected clock outside what the scripts
// compute exactly is an error, not a wrong answer.
func TestInjectedTimeOutOfRange(t *testing.T) {
	_, client := startClient(t)
	check := store.Check{Key: "k", Limit: store.Limit{Algorithm: algorithms.KindGCRA, Requests: 1, Window: time.Second}, Cost: 1}
	for _, us := range []int64{-1, 1 << 52, math.MaxInt64 / 1000} {
		s := newStore(t, client, Options{Now: newClock(us).Now})
		err := s.Decide(context.Background(), []store.Check{check}, make([]algorithms.Result, 1))
		if err == nil || !strings.Contains(err.Error(), "injected time") {
			t.Errorf("now %d us: %v", us, err)
		}
	}
}

// TestSlidingLogClockStepBack: when the clock steps back, the sorted set
// (ordered by time) and the Go ring (ordered by arrival) may differ. The
// script keeps exactly the entries younger than the window as of the latest
// time the key has seen (high), never admits more than the limit of them, and
// its running total stays equal to the sum of its entries.
func TestSlidingLogClockStepBack(t *testing.T) {
	_, client := startClient(t)
	ctx := context.Background()
	rng := rand.New(rand.NewSource(7))
	clk := newClock(1_700_000_000_000_000)
	s := newStore(t, client, Options{Now: clk.Now})
	const limit, window = 20, 1_000_000
	l := store.Limit{Algorithm: algorithms.KindSlidingLog, Requests: limit, Window: micros(window)}
	type entry struct{ at, cost int64 }
	var admitted []entry
	out := make([]algorithms.Result, 1)
	var denied int
	var high int64 // the latest time the key has seen
	for step := range 3000 {
		switch r := rng.Intn(10); {
		case r < 1:
			clk.add(-rng.Int63n(window / 2))
		case r < 4:
		default:
			clk.add(rng.Int63n(window / 5))
		}
		cost := 1 + rng.Int63n(3)
		if err := s.Decide(ctx, []store.Check{{Key: "log", Limit: l, Cost: cost}}, out); err != nil {
			t.Fatal(err)
		}
		now := clk.get()
		high = max(high, now)
		if !out[0].Allowed {
			denied++
			continue
		}
		admitted = append(admitted, entry{now, cost})
		var live int64
		for _, e := range admitted {
			if e.at > high-window {
				live += e.cost
			}
		}
		if live > limit {
			t.Fatalf("step %d at %d: %d admitted younger than the window as of %d, limit %d", step, now, live, high, limit)
		}
		if out[0].Remaining != limit-live {
			t.Fatalf("step %d: remaining %d, want %d", step, out[0].Remaining, limit-live)
		}
		members, err := client.ZRangeWithScores(ctx, "log", 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		var sum int64
		for _, m := range members[1:] {
			_, c, _ := strings.Cut(m.Member.(string), ":")
			n, _ := strconv.ParseInt(c, 10, 64)
			sum += n
		}
		if members[0].Member != "#" || int64(-1-members[0].Score) != sum {
			t.Fatalf("step %d: total member %+v, entries sum to %d", step, members[0], sum)
		}
	}
	if denied < 100 || len(admitted) < 100 {
		t.Fatalf("%d admitted, %d denied: the steps do not exercise both outcomes", len(admitted), denied)
	}
}
