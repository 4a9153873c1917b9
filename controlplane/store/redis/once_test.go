package redisstore

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/store"
)

// onceReplicas checks store.Once across two stores (two control-plane
// replicas) on one Redis through client: keys spread over many hash slots,
// each charged with one token by both replicas at once, several times: each
// key is charged exactly once, the other calls are duplicates, and a second
// token charges again.
func onceReplicas(t *testing.T, client redis.UniversalClient, prefix string) {
	t.Helper()
	ctx := context.Background()
	replicas := []*Store{newStore(t, client, Options{}), newStore(t, client, Options{})}
	lim := store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 100, Window: time.Hour}
	const keys, sends = 16, 4
	var checks [][]store.Check // per send: one charge of 30 per key, one token
	for range sends {
		var cs []store.Check
		for i := range keys {
			key := store.Key(prefix, []store.Entry{{Key: "user", Value: strconv.Itoa(i)}}, "l", algorithms.KindFixedWindow)
			cs = append(cs, store.Check{Key: key, Limit: lim, Cost: 30, Mode: store.Charge, Once: &store.Once{Token: "batch-1"}})
		}
		checks = append(checks, cs)
	}
	var wg sync.WaitGroup
	errs := make(chan error, sends)
	for k := range sends {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- replicas[k%2].Decide(ctx, checks[k], make([]algorithms.Result, keys))
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for i := range keys {
		applied := 0
		for k := range sends {
			if !checks[k][i].Once.Duplicate {
				applied++
			}
		}
		if applied != 1 {
			t.Fatalf("key %d: token applied %d times of %d sends, want once", i, applied, sends)
		}
	}
	// A probe of every key shows 30 used; a new token charges again.
	out := make([]algorithms.Result, keys)
	for round, want := range []int64{70, 40} {
		var cs []store.Check
		for i := range keys {
			c := checks[0][i]
			c.Once = &store.Once{Token: "batch-2"}
			if round == 0 {
				c.Mode, c.Cost, c.Once = store.Probe, 0, nil
			}
			cs = append(cs, c)
		}
		if err := replicas[round].Decide(ctx, cs, out); err != nil {
			t.Fatal(err)
		}
		for i, r := range out {
			if r.Remaining != want {
				t.Fatalf("round %d key %d: remaining %d, want %d", round, i, r.Remaining, want)
			}
		}
	}
}

// TestOnceReplicas is onceReplicas on one standalone Redis.
func TestOnceReplicas(t *testing.T) {
	_, client := startClient(t)
	onceReplicas(t, client, "replicas")
}

// TestOnceKeySlot: the dedupe key is in its key's hash slot, for keys with
// a hash tag (as store.Key makes them) and without, and has one size
// whatever the key and the token; two pairs have two keys.
func TestOnceKeySlot(t *testing.T) {
	seen := map[string]bool{}
	for _, key := range []string{
		store.Key("api", []store.Entry{{Key: "user", Value: "alice"}}, "l", algorithms.KindFixedWindow),
		store.Key("api", []store.Entry{{Key: "user", Value: strings.Repeat("v", 5000)}}, "l", algorithms.KindFixedWindow),
		"plain",
		"a}b{c}d",
		"{}x",
	} {
		for _, token := range []string{"tok-1", strings.Repeat("t", store.MaxOnceToken)} {
			dk := onceKey(key, token)
			if got, want := slot(hashTag(dk)), slot(hashTag(key)); got != want {
				t.Errorf("key %q: dedupe key %q in slot %d, the key in %d", key, dk, got, want)
			}
			if len(dk) > 28 || seen[dk] {
				t.Errorf("key %q, token %q: dedupe key %q (%d bytes, seen before: %v)", key, token, dk, len(dk), seen[dk])
			}
			seen[dk] = true
		}
	}
	// Redis's own example slots (CLUSTER KEYSLOT).
	for tag, want := range map[string]int{"": 0, "123456789": 12739, "user1000": 3443, "foo": 12182} {
		if got := slot(tag); got != want {
			t.Errorf("slot(%q) = %d, want %d", tag, got, want)
		}
	}
	for s, tag := range slotTags() {
		if tag == "" || len(tag) > 4 || slot(tag) != s {
			t.Fatalf("slot %d: tag %q", s, tag)
		}
	}
}

// markOnce checks MarkOnce through client: marked tokens are duplicates
// for a charge within their time left and not after it; a token Redis
// remembers for longer keeps its time.
func markOnce(t *testing.T, client redis.UniversalClient, prefix string) {
	t.Helper()
	ctx := context.Background()
	clk := newClock(1_700_000_000_000_000)
	s := newStore(t, client, Options{Now: clk.Now, OnceTTL: time.Hour})
	lim := store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 100, Window: time.Hour}
	var marks []store.OnceMark
	for i := range 8 {
		key := store.Key(prefix, []store.Entry{{Key: "user", Value: strconv.Itoa(i)}}, "l", algorithms.KindFixedWindow)
		marks = append(marks, store.OnceMark{Key: key, Token: "m/0", Left: time.Minute})
	}
	// Key 0's token is applied here first, for the hour: the mark keeps it.
	charge := func(i int, token string) bool {
		o := &store.Once{Token: token}
		if err := s.Decide(ctx, []store.Check{{Key: marks[i].Key, Limit: lim, Cost: 1, Mode: store.Charge, Once: o}}, make([]algorithms.Result, 1)); err != nil {
			t.Fatal(err)
		}
		return o.Duplicate
	}
	charge(0, "m/0")
	if err := s.MarkOnce(ctx, marks); err != nil {
		t.Fatal(err)
	}
	for i := range marks {
		if !charge(i, "m/0") {
			t.Fatalf("key %d: a marked token charged", i)
		}
	}
	clk.add(int64(time.Minute / time.Microsecond))
	if !charge(0, "m/0") {
		t.Fatal("key 0: the mark shortened a token Redis remembered for an hour")
	}
	for i := 1; i < len(marks); i++ {
		if charge(i, "m/0") {
			t.Fatalf("key %d: a mark outlived its time left", i)
		}
	}
}

// TestMarkOnce is markOnce on one standalone Redis.
func TestMarkOnce(t *testing.T) {
	_, client := startClient(t)
	markOnce(t, client, "mark")
}
