package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/store"
)

// OnceMarkBytes bounds what one settlement token (a store.Once dedupe
// key) costs Redis, whatever its key and token: TestOnceMarkBytes measures
// 133 bytes of used_memory (Redis 7.0, 100,000 tokens), which rises to
// about 145 just after Redis doubles its key tables. docs/usage-based.md
// states it, and the bound of settlement tokens is computed with it.
const OnceMarkBytes = 150

// usedMemory returns Redis's used_memory.
func usedMemory(t testing.TB, c *redis.Client) int64 {
	t.Helper()
	info, err := c.InfoMap(context.Background(), "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(info["Memory"]["used_memory"], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestOnceMarkBytes measures the bytes one settlement token costs Redis
// (used_memory before and after 100,000 of them, on one key and on as many
// keys, minus what the keys cost without tokens), for the tokens sluice's
// filter sends (<8 hex>-<sequence>/<descriptor>) and for the longest ones a
// client may send (64 bytes, on a 128-byte key), and checks the worst stays
// within OnceMarkBytes.
func TestOnceMarkBytes(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 100,000 tokens a case")
	}
	const n = 100_000
	lim := store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 1 << 40, Window: time.Hour}
	for _, tc := range []struct {
		name         string
		token        func(i int) string
		value        func(i int) string // the descriptor's value: one key, or a key per token
		wantAtMost   int64
		perTokenKeys bool
	}{
		{"filter tokens, one key", func(i int) string { return fmt.Sprintf("3f9a01c2-%d/0", i) }, func(int) string { return "alice" }, OnceMarkBytes, false},
		{"64-byte tokens, one 128-byte key", func(i int) string { return fmt.Sprintf("%064d", i) + "/63" },
			func(int) string { return strings.Repeat("v", 90) }, OnceMarkBytes, false},
		{"filter tokens, a key each", func(i int) string { return fmt.Sprintf("3f9a01c2-%d/0", i) }, func(i int) string { return "u" + strconv.Itoa(i) }, OnceMarkBytes, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, c := startClient(t)
			st := newStore(t, c, Options{})
			ctx := context.Background()
			decide := func(withTokens bool) {
				const batch = 500
				for i := 0; i < n; i += batch {
					checks := make([]store.Check, batch)
					for j := range checks {
						key := store.Key("llm", []store.Entry{{Key: "user", Value: tc.value(i + j)}}, "r0#0", algorithms.KindFixedWindow)
						checks[j] = store.Check{Key: key, Limit: lim, Cost: 1, Mode: store.Charge}
						if withTokens {
							checks[j].Once = &store.Once{Token: tc.token(i + j)}
						}
					}
					if err := st.Decide(ctx, checks, make([]algorithms.Result, batch)); err != nil {
						t.Fatal(err)
					}
				}
			}
			before := usedMemory(t, c)
			decide(false) // the keys alone
			keys := usedMemory(t, c)
			decide(true)
			after := usedMemory(t, c)
			per := (after - keys) / n
			t.Logf("%s: %d tokens cost %d bytes of used_memory, %d a token (the keys alone: %d bytes)", tc.name, n, after-keys, per, keys-before)
			if per > tc.wantAtMost {
				t.Errorf("%d bytes a token, more than the %d stated (OnceMarkBytes)", per, tc.wantAtMost)
			}
		})
	}
}
