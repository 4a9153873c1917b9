package precheck

import (
	"encoding/binary"
	"math/rand/v2"
)

// The table's index is an open-addressing hash table (linear probing,
// deletion by backward shift, so no tombstones) from a descriptor key to its
// entry. It replaces a map[string]int32: in filter.wasm under wazero, a Go
// map lookup with a string key costs 250-400ns (no AES hashing on wasm, and
// many small calls), this one well under half of that. Keys are hashed with
// a per-table random seed, so that a client cannot choose descriptors that
// collide.

// minSlots is the smallest index.
const minSlots = 16

// Multipliers of the hash (splitmix64's).
const (
	m1 = 0x9e3779b97f4a7c15
	m2 = 0xbf58476d1ce4e5b9
	m3 = 0x94d049bb133111eb
)

// hashKey returns a 64-bit hash of key under seed. It reads the key eight
// bytes at a time (one load each on wasm) and finishes with splitmix64's
// mixer, so that every key bit affects the slot bits.
func hashKey(seed uint64, key []byte) uint64 {
	n := len(key)
	h := seed ^ uint64(n)*m1
	switch {
	case n >= 8:
		// Whole words, then the last eight bytes (overlapping the last word
		// read when n is not a multiple of 8).
		for b := key; len(b) > 8; b = b[8:] {
			h = mix(h, binary.LittleEndian.Uint64(b))
		}
		h = mix(h, binary.LittleEndian.Uint64(key[n-8:]))
	case n >= 4:
		// Two overlapping 32-bit reads cover every byte.
		h = mix(h, uint64(binary.LittleEndian.Uint32(key))|uint64(binary.LittleEndian.Uint32(key[n-4:]))<<32)
	case n > 0:
		h = mix(h, uint64(key[0])|uint64(key[n/2])<<8|uint64(key[n-1])<<16)
	}
	h ^= h >> 30
	h *= m2
	h ^= h >> 27
	h *= m3
	h ^= h >> 31
	return h
}

// mix folds the word w into the hash h.
func mix(h, w uint64) uint64 {
	h = (h ^ w) * m2
	return h ^ h>>31
}

// equal reports whether a and b hold the same bytes. It compares eight
// bytes at a time: in filter.wasm, bytes.Equal (runtime.memequal) compares
// one byte per loop iteration, which made it the largest cost of a lookup.
func equal(a, b []byte) bool {
	n := len(a)
	if len(b) != n {
		return false
	}
	if n < 8 {
		return string(a) == string(b)
	}
	for i := 0; i < n-8; i += 8 {
		if binary.LittleEndian.Uint64(a[i:]) != binary.LittleEndian.Uint64(b[i:]) {
			return false
		}
	}
	return binary.LittleEndian.Uint64(a[n-8:]) == binary.LittleEndian.Uint64(b[n-8:])
}

// newSeed returns a random hash seed.
func newSeed() uint64 { return rand.Uint64() }

// lookup returns the index of the entry for key, whose hash is h, or -1.
func (t *Table) lookup(key []byte, h uint64) int32 {
	if len(t.slots) == 0 {
		return -1
	}
	mask := uint64(len(t.slots) - 1)
	for p := h & mask; ; p = (p + 1) & mask {
		s := t.slots[p]
		if s == 0 {
			return -1
		}
		if e := &t.entries[s-1]; e.hash == h && equal(e.key, key) {
			return int32(s - 1)
		}
	}
}

// indexAdd adds entry i, whose hash is set, to the index, growing the
// index to keep it at most half full.
func (t *Table) indexAdd(i int32) {
	if 2*(t.count+1) > len(t.slots) {
		t.indexGrow()
	}
	t.indexPlace(i)
	t.count++
}

// indexPlace puts entry i in the first free slot of its probe sequence.
func (t *Table) indexPlace(i int32) {
	mask := uint64(len(t.slots) - 1)
	p := t.entries[i].hash & mask
	for t.slots[p] != 0 {
		p = (p + 1) & mask
	}
	t.slots[p] = uint32(i) + 1
}

// indexGrow doubles the index (or makes the first one) and re-places the
// indexed entries.
func (t *Table) indexGrow() {
	old := t.slots
	t.slots = make([]uint32, max(minSlots, 2*len(old)))
	for _, s := range old {
		if s != 0 {
			t.indexPlace(int32(s - 1))
		}
	}
}

// indexRemove removes entry i from the index. The entries after it in its
// run move back into the hole where their probe sequence allows, so that
// every entry stays reachable from its home slot without tombstones.
func (t *Table) indexRemove(i int32) {
	mask := uint64(len(t.slots) - 1)
	p := t.entries[i].hash & mask
	for t.slots[p] != uint32(i)+1 {
		p = (p + 1) & mask
	}
	t.count--
	for {
		t.slots[p] = 0
		q := p
		for {
			q = (q + 1) & mask
			s := t.slots[q]
			if s == 0 {
				return
			}
			// The entry at q may fill the hole at p if p lies on its probe
			// sequence, between its home slot and q.
			home := t.entries[s-1].hash & mask
			if (q-home)&mask >= (q-p)&mask {
				t.slots[p] = s
				p = q
				break
			}
		}
	}
}
