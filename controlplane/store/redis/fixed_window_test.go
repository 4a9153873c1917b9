package redisstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/store"
)

// TestFixedWindowExpiry: the write that opens a window sets the expiry; later
// writes in it keep that expiry; a limit changed to a longer window under a
// live state moves the expiry to the new end.
func TestFixedWindowExpiry(t *testing.T) {
	_, client := startClient(t)
	ctx := context.Background()
	clk := newClock(1_699_999_200_000_000) // a whole hour
	s := newStore(t, client, Options{Now: clk.Now})
	key := keyName("fw-expiry", 0)
	decide := func(w time.Duration) algorithms.Result {
		t.Helper()
		out := make([]algorithms.Result, 1)
		l := store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 100, Window: w}
		if err := s.Decide(ctx, []store.Check{{Key: key, Limit: l, Cost: 1}}, out); err != nil || !out[0].Allowed {
			t.Fatalf("decide: %+v, %v", out[0], err)
		}
		return out[0]
	}
	expireAt := func() int64 {
		t.Helper()
		ms, err := client.PExpireTime(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		return int64(ms / time.Millisecond)
	}
	decide(time.Minute)
	first := expireAt()
	wantState(t, client, key, map[string]string{"1699999200000000:60000000": "1"})
	for i := range 3 {
		clk.add(7_000_000)
		if r := decide(time.Minute); r.Remaining != 100-int64(i+2) {
			t.Fatalf("remaining %d", r.Remaining)
		}
	}
	wantState(t, client, key, map[string]string{"1699999200000000:60000000": "4"})
	if got := expireAt(); got != first {
		t.Errorf("a write in the same window moved the expiry from %d to %d", first, got)
	}
	// A longer window keeps the start (the old start is the new window's
	// too: the clock is on an hour) and needs a later expiry.
	r := decide(time.Hour)
	if r.Remaining != 95 {
		t.Fatalf("remaining %d after the window change, want 95", r.Remaining)
	}
	wantState(t, client, key, map[string]string{"1699999200000000:3600000000": "5"})
	// The new end is 59m39s after the clock, the old one was 60s after it.
	if got, min := expireAt(), first+int64(58*time.Minute/time.Millisecond); got < min {
		t.Errorf("after the window grew to an hour the expiry is %d ms, want at least %d", got, min)
	}
}

// wantState fails unless key holds the fixed_window hash want.
func wantState(t *testing.T, client *redis.Client, key string, want map[string]string) {
	t.Helper()
	got, err := client.HGetAll(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("state %v, want %v", got, want)
	}
}

// TestFixedWindowLegacyState: a state written as the string "start:count"
// (before the hash) is read, counted on, and replaced by the hash with an
// expiry; a denial leaves it alone.
func TestFixedWindowLegacyState(t *testing.T) {
	_, client := startClient(t)
	ctx := context.Background()
	clk := newClock(1_699_999_200_000_000)
	s := newStore(t, client, Options{Now: clk.Now})
	key := keyName("fw-legacy", 0)
	if err := client.Set(ctx, key, "1699999200000000:4", 0).Err(); err != nil {
		t.Fatal(err)
	}
	out := make([]algorithms.Result, 1)
	l := store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 5, Window: time.Minute}
	if err := s.Decide(ctx, []store.Check{{Key: key, Limit: l, Cost: 1}}, out); err != nil {
		t.Fatal(err)
	}
	if !out[0].Allowed || out[0].Remaining != 0 {
		t.Fatalf("on a legacy state of 4: %+v", out[0])
	}
	wantState(t, client, key, map[string]string{"1699999200000000:60000000": "5"})
	if ttl := client.PTTL(ctx, key).Val(); ttl <= 0 {
		t.Errorf("legacy state rewritten without an expiry (PTTL %v)", ttl)
	}
	if err := s.Decide(ctx, []store.Check{{Key: key, Limit: l, Cost: 1}}, out); err != nil || out[0].Allowed {
		t.Fatalf("over the limit: %+v, %v", out[0], err)
	}
}

// TestUniformArguments: a script call whose checks share one limit and cost
// sends that pair once; its results equal those of the same checks sent
// with a pair each.
func TestUniformArguments(t *testing.T) {
	_, client := startClient(t)
	ctx := context.Background()
	clk := newClock(1_699_999_200_000_000)
	s := newStore(t, client, Options{Now: clk.Now})
	l := store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 3, Window: time.Second}
	other := store.Limit{Algorithm: algorithms.KindTokenBucket, Requests: 3, Window: time.Second}
	const n = 5
	for round := range 5 {
		// uniform: n checks of l, cost 1, on keys u0..u4
		uni := make([]store.Check, n)
		for i := range uni {
			uni[i] = store.Check{Key: keyName("uniform", i), Limit: l, Cost: 1}
		}
		// mixed: the same on keys m0..m4, plus a check of another limit
		mixed := make([]store.Check, n+1)
		for i := range n {
			mixed[i] = store.Check{Key: keyName("mixed", i), Limit: l, Cost: 1}
		}
		mixed[n] = store.Check{Key: keyName("mixed-other", 0), Limit: other, Cost: 1}
		if !uniform(refsOf(uni), numsOf(uni)) || uniform(refsOf(mixed), numsOf(mixed)) {
			t.Fatal("uniform misjudges the batches")
		}
		a, b := make([]algorithms.Result, n), make([]algorithms.Result, n+1)
		if err := s.Decide(ctx, uni, a); err != nil {
			t.Fatal(err)
		}
		if err := s.Decide(ctx, mixed, b); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			if a[i] != b[i] {
				t.Fatalf("round %d check %d: uniform %+v, per-check %+v", round, i, a[i], b[i])
			}
		}
		if a[0].Allowed != (round < 3) {
			t.Fatalf("round %d: %+v", round, a[0])
		}
		clk.add(100_000)
	}
}

// refsOf and numsOf build newScriptCmd's inputs for checks, as one call.
func refsOf(checks []store.Check) []ref {
	c := &call{}
	for _, ch := range checks {
		w, err := encode(ch, 0)
		if err != nil {
			panic(err)
		}
		c.wires = append(c.wires, w)
	}
	refs := make([]ref, len(checks))
	for i := range refs {
		refs[i] = ref{c, i}
	}
	return refs
}

func numsOf(checks []store.Check) []int {
	var lims []store.Limit
	nums := make([]int, len(checks))
	for i, ch := range checks {
		n := -1
		for j, l := range lims {
			if l == ch.Limit {
				n = j
			}
		}
		if n < 0 {
			n = len(lims)
			lims = append(lims, ch.Limit)
		}
		nums[i] = n + 1
	}
	return nums
}
