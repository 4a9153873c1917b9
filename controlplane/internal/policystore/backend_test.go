package policystore

import (
	"context"
	"errors"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
)

// newRedisClient returns a client for addrs (a cluster client when there
// are several), closed when the test ends.
func newRedisClient(t testing.TB, addrs ...string) redis.UniversalClient {
	t.Helper()
	c := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: addrs})
	t.Cleanup(func() { c.Close() })
	return c
}

// newRedisBackend returns a Redis backend on addrs.
func newRedisBackend(t testing.TB, addrs ...string) *Redis {
	t.Helper()
	b, err := NewRedis(newRedisClient(t, addrs...), RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// testBackend runs the behaviour every Backend must have against b, a new
// empty store.
func testBackend(t *testing.T, b Backend) {
	ctx := context.Background()

	if v, err := b.Version(ctx); err != nil || v != 0 {
		t.Fatalf("empty store: Version = %d, %v; want 0", v, err)
	}
	if st, err := b.Load(ctx); err != nil || st.Version != 0 || len(st.Records) != 0 {
		t.Fatalf("empty store: Load = %+v, %v; want version 0, no records", st, err)
	}
	if _, _, err := b.Put(ctx, "a", []byte("x"), Guard{}); !errors.Is(err, ErrUninitialized) {
		t.Fatalf("Put before Init: err = %v; want ErrUninitialized", err)
	}
	if _, err := b.Delete(ctx, "a", Guard{}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Delete before Init: err = %v; want ErrNotFound", err)
	}
	if _, err := b.Init(ctx, State{}); err == nil {
		t.Fatal("Init of version 0: no error")
	}
	if ok, err := b.Init(ctx, State{Version: 1}); err != nil || !ok {
		t.Fatalf("Init = %v, %v; want true", ok, err)
	}
	if ok, err := b.Init(ctx, State{Version: 9, Records: []Record{{Domain: "z", Version: 9, YAML: []byte("z")}}}); err != nil || ok {
		t.Fatalf("second Init = %v, %v; want false (the store is not empty)", ok, err)
	}

	weird := "we{ird}:na me/ü%"
	steps := []struct {
		name      string
		del       bool
		domain    string
		yaml      string
		guard     Guard
		version   uint64
		unchanged bool
		conflict  uint64 // Actual of the expected ConflictError, +1 (0: no conflict)
		notFound  bool
	}{
		{name: "create a", domain: "a", yaml: "a1", version: 2},
		{name: "same bytes", domain: "a", yaml: "a1", version: 2, unchanged: true},
		{name: "same bytes, stale guard", domain: "a", yaml: "a1", guard: Expect(1), conflict: 2 + 1},
		{name: "stale guard", domain: "a", yaml: "a2", guard: Expect(1), conflict: 2 + 1},
		{name: "create-only on existing", domain: "a", yaml: "a2", guard: Expect(0), conflict: 2 + 1},
		{name: "right guard", domain: "a", yaml: "a2", guard: Expect(2), version: 3},
		{name: "create-only", domain: "b", yaml: "b1", guard: Expect(0), version: 4},
		{name: "guard on missing", domain: "c", yaml: "c1", guard: Expect(4), conflict: 0 + 1},
		{name: "hostile name", domain: weird, yaml: "w1\n{}:", version: 5},
		{name: "delete missing", del: true, domain: "c", notFound: true},
		{name: "delete stale", del: true, domain: "a", guard: Expect(2), conflict: 3 + 1},
		{name: "delete", del: true, domain: "a", guard: Expect(3), version: 6},
		{name: "delete again", del: true, domain: "a", notFound: true},
		{name: "recreate", domain: "a", yaml: "a3", guard: Expect(0), version: 7},
	}
	for _, s := range steps {
		var v uint64
		var unchanged bool
		var err error
		if s.del {
			v, err = b.Delete(ctx, s.domain, s.guard)
		} else {
			v, unchanged, err = b.Put(ctx, s.domain, []byte(s.yaml), s.guard)
		}
		var ce *ConflictError
		switch {
		case s.conflict > 0:
			if !errors.As(err, &ce) || ce.Domain != s.domain || ce.Expected != s.guard.Version || ce.Actual != s.conflict-1 {
				t.Fatalf("%s: err = %v; want a conflict with actual version %d", s.name, err, s.conflict-1)
			}
		case s.notFound:
			if !errors.Is(err, ErrNotFound) {
				t.Fatalf("%s: err = %v; want ErrNotFound", s.name, err)
			}
		case err != nil:
			t.Fatalf("%s: %v", s.name, err)
		case v != s.version || unchanged != s.unchanged:
			t.Fatalf("%s: version %d unchanged %v; want %d %v", s.name, v, unchanged, s.version, s.unchanged)
		}
	}
	want := State{Version: 7, Records: []Record{
		{Domain: "a", Version: 7, YAML: []byte("a3")},
		{Domain: "b", Version: 4, YAML: []byte("b1")},
		{Domain: weird, Version: 5, YAML: []byte("w1\n{}:")},
	}}
	st, err := b.Load(ctx)
	if err != nil || !reflect.DeepEqual(st, want) {
		t.Fatalf("Load = %+v, %v\nwant %+v", st, err, want)
	}
	if v, err := b.Version(ctx); err != nil || v != 7 {
		t.Fatalf("Version = %d, %v; want 7", v, err)
	}
}

// expectHint waits for a hint on ch.
func expectHint(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(2 * time.Second):
		t.Fatalf("%s: no change hint within 2 s", what)
	}
}

// drain empties ch.
func drain(ch <-chan struct{}) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

// testRedisNotifies: a write by another client reaches a subscriber as a
// hint, through Redis pub/sub.
func testRedisNotifies(t *testing.T, namespace string, addrs ...string) {
	ctx := context.Background()
	writer, err := NewRedis(newRedisClient(t, addrs...), RedisOptions{Namespace: namespace})
	if err != nil {
		t.Fatal(err)
	}
	reader, err := NewRedis(newRedisClient(t, addrs...), RedisOptions{Namespace: namespace})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := writer.Init(ctx, State{Version: 1}); err != nil {
		t.Fatal(err)
	}
	hints := reader.Subscribe(t.Context())
	expectHint(t, hints, "the subscription itself") // confirms the subscription is live
	drain(hints)
	if _, _, err := writer.Put(ctx, "a", []byte("x"), Guard{}); err != nil {
		t.Fatal(err)
	}
	expectHint(t, hints, "a Put by another client")
	if _, err := writer.Delete(ctx, "a", Guard{}); err != nil {
		t.Fatal(err)
	}
	expectHint(t, hints, "a Delete by another client")
}

func TestRedisNotifies(t *testing.T) { testRedisNotifies(t, "", redistest.StartServer(t).Addr()) }

// TestFileNotifies: writes through a File hint its subscribers; the
// subscription ends with its context.
func TestFileNotifies(t *testing.T) {
	b, err := NewFile(filepath.Join(t.TempDir(), "p.json"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	hints := b.Subscribe(ctx)
	if _, err := b.Init(context.Background(), State{Version: 1}); err != nil {
		t.Fatal(err)
	}
	expectHint(t, hints, "Init")
	if _, _, err := b.Put(context.Background(), "a", []byte("x"), Guard{}); err != nil {
		t.Fatal(err)
	}
	expectHint(t, hints, "Put")
	cancel()
	for range hints { // closed once ctx ends
	}
}

func TestFileBackend(t *testing.T) {
	b, err := NewFile(filepath.Join(t.TempDir(), "sub", "policies.json"))
	if err != nil {
		t.Fatal(err)
	}
	testBackend(t, b)
}

func TestRedisBackend(t *testing.T) {
	srv := redistest.StartServer(t)
	testBackend(t, newRedisBackend(t, srv.Addr()))
}

// TestRedisCluster runs the backend's behaviour and its notifications on a
// 3-master Redis Cluster: every key carries one hash tag, so the scripts
// (which read the domains' keys from the set of names) run in one slot.
func TestRedisCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	t.Run("backend", func(t *testing.T) { testBackend(t, newRedisBackend(t, c.Addrs()...)) })
	t.Run("notifies", func(t *testing.T) { testRedisNotifies(t, "notify", c.Addrs()...) })
}

func TestRedisNamespaces(t *testing.T) {
	srv := redistest.StartServer(t)
	client := newRedisClient(t, srv.Addr())
	ctx := context.Background()
	one, err := NewRedis(client, RedisOptions{Namespace: "one"})
	if err != nil {
		t.Fatal(err)
	}
	two, err := NewRedis(client, RedisOptions{Namespace: "two"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := one.Init(ctx, State{Version: 3, Records: []Record{{Domain: "d", Version: 2, YAML: []byte("y")}}}); err != nil {
		t.Fatal(err)
	}
	if v, err := two.Version(ctx); err != nil || v != 0 {
		t.Fatalf("namespace two sees version %d, %v; want an empty store", v, err)
	}
	if keys, err := client.Keys(ctx, "sluice:{one}:*").Result(); err != nil || len(keys) != 3 {
		t.Fatalf("keys of namespace one: %q, %v; want version, domains and one domain", keys, err)
	}
	for _, ns := range []string{"a{b", "a}b", "a\nb"} {
		if _, err := NewRedis(client, RedisOptions{Namespace: ns}); err == nil {
			t.Errorf("namespace %q accepted", ns)
		}
	}
}

func TestInitRejectsBadStates(t *testing.T) {
	b, err := NewFile(filepath.Join(t.TempDir(), "p.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range []State{
		{},
		{Version: 2, Records: []Record{{Domain: "a", Version: 3}}},
		{Version: 2, Records: []Record{{Domain: "a", Version: 0}}},
		{Version: 2, Records: []Record{{Domain: "a", Version: 1}, {Domain: "a", Version: 2}}},
	} {
		if ok, err := b.Init(context.Background(), st); err == nil || ok {
			t.Errorf("Init(%+v) = %v, %v; want an error", st, ok, err)
		}
	}
	if v, _ := b.Version(context.Background()); v != 0 {
		t.Fatalf("a rejected Init wrote version %d", v)
	}
}
