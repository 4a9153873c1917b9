package precheck

import (
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/sluicehq/sluice/algorithms"
)

// TestIndexFindsEveryEntry records random keys of every length into small
// tables, so that the index grows, entries are evicted and their slots
// freed by backward shift, and checks after each step that every
// remembered key (and no other) is found, against a reference set.
func TestIndexFindsEveryEntry(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	lim := Limit{Algorithm: algorithms.KindFixedWindow, Limit: 1, Window: 1000 * ms}
	for _, max := range []int{1, 3, 16, 100} {
		tab := NewTable(max, 20*ms)
		keys := make([][]byte, 400)
		for i := range keys {
			n := i % 41 // lengths 0..40, across the hash's cases
			keys[i] = make([]byte, n)
			for j := range keys[i] {
				keys[i][j] = "ab"[rng.IntN(2)] // many keys share prefixes
			}
			keys[i] = append(keys[i], strconv.Itoa(i)...)
		}
		for step := 0; step < 20000; step++ {
			key := keys[rng.IntN(len(keys))]
			tab.Record(key, Outcome{Cost: 1, Limit: lim, HasLimit: true}, 0)
			if step%97 != 0 {
				continue
			}
			remembered := map[string]bool{}
			for i := tab.head; i >= 0; i = tab.entries[i].next {
				remembered[string(tab.entries[i].key)] = true
			}
			if len(remembered) != tab.Len() || tab.Len() > max {
				t.Fatalf("max %d: %d entries listed, Len %d", max, len(remembered), tab.Len())
			}
			for _, k := range keys {
				i := tab.lookup(k, hashKey(tab.seed, k))
				if found := i >= 0; found != remembered[string(k)] || (found && string(tab.entries[i].key) != string(k)) {
					t.Fatalf("max %d: key %q found %v (entry %d), remembered %v", max, k, found, i, remembered[string(k)])
				}
			}
		}
	}
}

// TestHashKeyUsesEveryByte checks that changing any one byte of keys of
// every length up to 40 changes the hash.
func TestHashKeyUsesEveryByte(t *testing.T) {
	const seed = 0x1234
	for n := 1; n <= 40; n++ {
		key := make([]byte, n)
		for i := range key {
			key[i] = byte('a' + i)
		}
		h := hashKey(seed, key)
		for i := range key {
			key[i] ^= 1
			if hashKey(seed, key) == h {
				t.Fatalf("length %d: flipping byte %d leaves the hash unchanged", n, i)
			}
			key[i] ^= 1
		}
		if hashKey(seed, key[:n-1]) == h {
			t.Fatalf("length %d: the hash ignores the length", n)
		}
	}
}

func TestEqual(t *testing.T) {
	for n := 0; n <= 40; n++ {
		a := make([]byte, n)
		for i := range a {
			a[i] = byte(i * 7)
		}
		b := append([]byte(nil), a...)
		if !equal(a, b) {
			t.Fatalf("length %d: equal keys differ", n)
		}
		for i := range b {
			b[i]++
			if equal(a, b) {
				t.Fatalf("length %d: a difference at %d is missed", n, i)
			}
			b[i]--
		}
		if n > 0 && equal(a, b[:n-1]) {
			t.Fatalf("length %d: a shorter key is equal", n)
		}
	}
}
