package shareddata

import (
	"encoding/binary"
	"math/rand/v2"
	"strconv"
)

// slots is the part of a shared table that the blocks (Store) and the
// leases (Leases) have in common: a fixed number of shared-data keys
// "<prefix><n>", the slot of a descriptor picked by a hash of its shared
// key (the domain, a NUL, the descriptor key) from the proxy's seed.
type slots struct {
	data   Data
	domain string
	prefix string
	mask   uint64 // slots - 1
	seed   uint64 // the proxy's hash seed, from seedKey
	// Scratch buffers, reused by every call: the slot's name and the
	// shared key of the descriptor slot last named, and its index.
	name, key []byte
	index     uint64
}

// newSlots returns n slots (rounded up to a power of two) named prefix<i>
// over data for domain. It reads the proxy's hash seed, and sets one if
// there is none yet.
func newSlots(data Data, domain, prefix string, n int) slots {
	size := 1
	for size < n {
		size *= 2
	}
	s := slots{data: data, domain: domain, prefix: prefix, mask: uint64(size - 1)}
	if !s.RefreshSeed() {
		seed := rand.Uint64()
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], seed)
		// Two VMs starting at once may both set one: the last one wins,
		// and RefreshSeed (on every tick) brings the other round to it.
		// Until then their slots differ, which loses entries, no more.
		if set, err := data.SetSharedData(seedKey, b[:], 0); err == nil && set {
			s.seed = seed
		}
		s.RefreshSeed()
	}
	return s
}

// RefreshSeed reads the proxy's hash seed; false when there is none.
func (s *slots) RefreshSeed() bool {
	v, _, found := s.data.SharedData(seedKey)
	if !found || len(v) != 8 {
		return false
	}
	s.seed = binary.LittleEndian.Uint64(v)
	return true
}

// proxyKey is hashed with the proxy's seed to name the proxy (Proxy).
var proxyKey = []byte("sluice.proxy")

// Proxy returns a number that names this proxy (every VM of it alike, once
// they read the same seed) and no other one but by chance, never 0: the
// filter names itself with it to the control plane (rlsproto.QuotaField).
// The seed itself is not shown.
func (s *slots) Proxy() uint64 { return max(hash(s.seed, proxyKey), 1) }

// slot sets s.key to the shared key of descriptor key and s.name to its
// slot's name; false when the shared key is too long.
func (s *slots) slot(key []byte) bool {
	if len(s.domain)+1+len(key) > MaxKeyLen {
		return false
	}
	s.key = append(append(append(s.key[:0], s.domain...), 0), key...)
	s.index = hash(s.seed, s.key) & s.mask
	s.name = strconv.AppendUint(append(s.name[:0], s.prefix...), s.index, 10)
	return true
}

// hash is FNV-1a over key from seed, finished with splitmix64's mixer so
// that every bit reaches the slot bits.
func hash(seed uint64, key []byte) uint64 {
	h := seed ^ 0xcbf29ce484222325
	for _, c := range key {
		h = (h ^ uint64(c)) * 0x100000001b3
	}
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	return h ^ h>>31
}
