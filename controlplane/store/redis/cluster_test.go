package redisstore

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/store"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestCluster runs the decision tests on a 3-master Redis Cluster: the
// differential for every algorithm (each Decide spreads over many slots and
// all three nodes), one Decide whose keys land on different slots and nodes,
// store.Once across two replicas, and NOSCRIPT recovery on every node.
func TestCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	t.Cleanup(func() { client.Close() })
	var nodes []*redis.Client
	for _, addr := range cl.Addrs() {
		c := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { c.Close() })
		nodes = append(nodes, c)
	}

	for i, alg := range algs {
		t.Run("differential/"+alg.String(), func(t *testing.T) {
			differential(t, client, alg, 200, 60, false, false, false, int64(400+i))
		})
	}

	t.Run("cross-slot", func(t *testing.T) {
		ctx := context.Background()
		s := newStore(t, client, Options{})
		// The function library goes to every master, and the script calls
		// below are FCALLs routed like EVALSHA, by their first key.
		if err := s.loadFunctions(ctx); err != nil {
			t.Fatal(err)
		}
		var fcalls int64
		for _, n := range nodes {
			if role, _ := n.Do(ctx, "ROLE").Slice(); len(role) > 0 && role[0] == "master" {
				if libs, err := n.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: libraryName}).Result(); err != nil || len(libs) != 1 {
					t.Fatalf("master %s: libraries %v (%v), want %s", n.Options().Addr, libs, err, libraryName)
				}
			}
			fcalls -= commandCalls(t, n, "fcall")
		}
		// Two checks per key (two limits on one descriptor would have
		// different keys; here the same key twice shows one slot group
		// holding several checks), eight distinct keys.
		var checks []store.Check
		slots := map[int64]bool{}
		owners := map[string]bool{}
		for i := range 8 {
			key := store.Key("cluster", []store.Entry{{Key: "user", Value: strconv.Itoa(i)}}, "l", algorithms.KindFixedWindow)
			slot, err := client.ClusterKeySlot(ctx, key).Result()
			if err != nil {
				t.Fatal(err)
			}
			slots[slot] = true
			owners[ownerOf(t, cl, slot)] = true
			l := store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 3, Window: time.Hour}
			checks = append(checks, store.Check{Key: key, Limit: l, Cost: 1}, store.Check{Key: key, Limit: l, Cost: 1})
		}
		if len(slots) < 2 || len(owners) < 2 {
			t.Fatalf("keys span %d slots on %d nodes; the test needs several", len(slots), len(owners))
		}
		callsBefore, _ := commandStats(t, nodes...)
		out := make([]algorithms.Result, len(checks))
		if err := s.Decide(ctx, checks, out); err != nil {
			t.Fatal(err)
		}
		callsAfter, _ := commandStats(t, nodes...)
		if got := callsAfter - callsBefore; got != int64(len(slots)) {
			t.Errorf("%d script calls for %d slots, want one per slot", got, len(slots))
		}
		for _, n := range nodes {
			fcalls += commandCalls(t, n, "fcall")
		}
		if fcalls != int64(len(slots)) {
			t.Errorf("%d FCALLs for %d slots, want one per slot", fcalls, len(slots))
		}
		for i, r := range out {
			// Within one script call the second check of a key sees the first.
			wantRemaining := int64(2 - i%2)
			if !r.Allowed || r.Remaining != wantRemaining || r.Limit != 3 {
				t.Errorf("check %d: %+v, want allowed with %d remaining", i, r, wantRemaining)
			}
		}
		// A second Decide: one more each fits (3), the next does not.
		if err := s.Decide(ctx, checks, out); err != nil {
			t.Fatal(err)
		}
		for i, r := range out {
			if r.Allowed != (i%2 == 0) {
				t.Errorf("second decide, check %d: %+v, want allowed=%v", i, r, i%2 == 0)
			}
		}
	})

	t.Run("once", func(t *testing.T) {
		// Keys over several slots and nodes, two replicas, one token: each
		// key charged once (the dedupe key shares its key's slot).
		onceReplicas(t, client, "cluster-once")
		markOnce(t, client, "cluster-mark")
		differentialWith(t, client, algorithms.KindTokenBucket, 100, 40, diffOptions{modes: true, once: true}, 1100)
	})

	t.Run("noscript", func(t *testing.T) {
		ctx := context.Background()
		s := newStore(t, client, Options{})
		var checks []store.Check
		for i := range 6 {
			key := store.Key("noscript", []store.Entry{{Key: "k", Value: strconv.Itoa(i)}}, "l", algorithms.KindSlidingLog)
			checks = append(checks, store.Check{Key: key, Limit: store.Limit{Algorithm: algorithms.KindSlidingLog, Requests: 2, Window: time.Hour}, Cost: 1})
		}
		out := make([]algorithms.Result, len(checks))
		if err := s.Decide(ctx, checks, out); err != nil {
			t.Fatal(err)
		}
		for _, n := range nodes {
			if err := n.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Decide(ctx, checks, out); err != nil {
			t.Fatalf("after SCRIPT FLUSH: %v", err)
		}
		for i, r := range out {
			if !r.Allowed || r.Remaining != 0 {
				t.Errorf("check %d after SCRIPT FLUSH: %+v, want the second of 2 allowed", i, r)
			}
		}
	})
}

// ownerOf returns the address of the node that serves slot: node i of n
// serves slots i*16384/n to (i+1)*16384/n-1.
func ownerOf(t *testing.T, cl *redistest.Cluster, slot int64) string {
	t.Helper()
	addrs := cl.Addrs()
	n := int64(len(addrs))
	for i := range n {
		if slot < (i+1)*16384/n {
			return addrs[i]
		}
	}
	t.Fatalf("slot %d out of range", slot)
	return ""
}
