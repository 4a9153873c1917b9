// Package shareddata is the proxy-wasm host's per-Envoy state, behind the
// core's interfaces (core.Blocks, lease.Pools): it shares the precheck's
// over-limit blocks among the Wasm VMs of one proxy (Envoy runs one VM per
// worker thread) through proxy-wasm shared data, so that a descriptor one
// VM heard is over its limit is rejected locally by every VM, not asked
// again by each; and the leases the control plane grants, as one pool per
// descriptor for the whole proxy (Leases, in a table of slots of its own).
//
// Shared data in proxy-wasm-cpp-host is one process-wide map per vm_id
// behind one mutex, with a compare-and-swap number per key; ABI 0.2.1 has
// no delete and no expiry. So the store is a fixed number of slots, each
// one shared-data key ("sluice.blocks.<n>"), and a descriptor goes to the
// slot its hash picks; a block overwrites whatever the slot held. Its
// memory is bounded whatever the traffic: Slots keys of at most MaxValue
// bytes each (see Bound). A slot holds the full key it blocks, so a
// collision only loses a block (that VM then asks the control plane, as it
// would without sharing), never rejects another descriptor.
//
// What a slot holds is a precheck.Block: the proxy's monotonic time the
// same request can pass the global limiter, without any VM's call timeout,
// which each reader subtracts itself (precheck.Table.Import). So a reader
// keeps the precheck's invariant, whichever VM (or VM incarnation, after a
// reload) wrote the block: it rejects only until the control plane's own
// reset, less its timeout.
//
// Nobody waits on anybody: a read is one host call; a write reads the slot
// and sets it if its CAS is unchanged, at most MaxAttempts times; when every
// attempt lost the race to another writer, the block stays in the writing
// VM's own table only (a later denial publishes it again). The host sets a
// key with no value whatever the CAS, so the first two writers of an empty
// slot may both succeed, the later overwriting the earlier: that loses a
// block, never makes one up.
package shareddata

import (
	"bytes"
	"encoding/binary"
	"strconv"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/filter/core/precheck"
)

// Data is the proxy's shared data: proxy_get_shared_data and
// proxy_set_shared_data.
type Data interface {
	// SharedData returns key's value (valid until the callback returns)
	// and its CAS number; found is false when key has no value.
	SharedData(key string) (value []byte, cas uint32, found bool)
	// SetSharedData sets key's value if its CAS number is still cas (0:
	// whatever it is; a key with no value is always set). set is false on
	// a CAS mismatch.
	SetSharedData(key string, value []byte, cas uint32) (set bool, err error)
}

const (
	// Slots is the number of slots a plugin uses: the most blocks the
	// proxy shares at once.
	Slots = 4096
	// MaxKeyLen is the longest shared key (the domain, a NUL, the
	// descriptor key); a longer one stays in its VM.
	MaxKeyLen = 512
	// MaxAttempts bounds the compare-and-swap attempts of one write.
	MaxAttempts = 3
	// header is the fixed part of a value (see encode).
	header = 1 + 3*8 + 1 + 1 + 3*8 + 2
	// MaxValue is the largest value of a slot.
	MaxValue = header + precheck.MaxNameLen + MaxKeyLen
	// version is the first byte of a value: a value of another layout (a
	// filter of another version sharing the vm_id) is ignored.
	version = 1
	// slotPrefix names the slots; seedKey holds the proxy's hash seed.
	slotPrefix = "sluice.blocks."
	seedKey    = "sluice.blocks.seed"
)

// Bound returns the most bytes of keys and values that slots slots can
// hold in the shared data (the host's per-entry overhead aside).
func Bound(slots int) int {
	return slots*(len(slotPrefix)+len(strconv.Itoa(slots-1))+MaxValue) + len(seedKey) + 8 + len(liveKey) + 8 + len(freedKey) + 8
}

// Store is one plugin instance's view of the shared blocks of its domain.
// It is not safe for concurrent use (a VM is single-threaded); the VMs
// share only the proxy's data.
type Store struct {
	slots
	value []byte // scratch, reused by every write
	// Retries counts the CAS mismatches of writes, and Lost the blocks
	// that stayed in the VM because every attempt lost; the plugin reports
	// their growth as metrics.
	Retries, Lost int
	// The proxy's live mark as last read (live.go): no block is live after
	// liveUntil; read at liveAt.
	liveUntil, liveAt int64
	liveRead          bool
	// The proxy's freed mark as last read (freed.go), at freedAt.
	freed     uint64
	freedAt   int64
	freedRead bool
}

// New returns the store of domain over data with slots slots (rounded up
// to a power of two). It reads the proxy's hash seed, and sets one if
// there is none yet.
func New(data Data, domain string, slots int) *Store {
	return &Store{slots: newSlots(data, domain, slotPrefix, slots)}
}

// Refresh reads the proxy's hash seed (two VMs that set a seed at once
// converge).
func (s *Store) Refresh() { s.RefreshSeed() }

// Contention returns Retries and Lost.
func (s *Store) Contention() (retries, lost int) { return s.Retries, s.Lost }

// Lookup returns the block shared for descriptor key that has not passed
// at now: one host call. The block's Name is valid until the callback
// returns.
func (s *Store) Lookup(key []byte, now int64) (precheck.Block, bool) {
	if !s.slot(key) {
		return precheck.Block{}, false
	}
	v, _, found := s.data.SharedData(bytesString(s.name))
	if !found {
		return precheck.Block{}, false
	}
	b, k, ok := decode(v)
	if !ok || b.PassAt <= now || !bytes.Equal(k, s.key) {
		return precheck.Block{}, false
	}
	return b, true
}

// Publish shares block b of descriptor key, unless its slot already holds
// a block of key that lasts at least as long. It reports false when the
// block stays in this VM only: every attempt lost the slot to another
// writer, or the host refused (err).
func (s *Store) Publish(key []byte, b precheck.Block, now int64) (bool, error) {
	if b.PassAt <= now || !s.slot(key) {
		return false, nil
	}
	s.value = encode(s.value[:0], b, s.key)
	for range MaxAttempts {
		v, cas, found := s.data.SharedData(bytesString(s.name))
		if found {
			if old, k, ok := decode(v); ok && old.PassAt >= b.PassAt && bytes.Equal(k, s.key) {
				s.raiseLive(old.PassAt)
				return true, nil // as good a block is there
			}
		} else {
			cas = 0
		}
		set, err := s.data.SetSharedData(bytesString(s.name), s.value, cas)
		if err != nil {
			s.Lost++
			return false, err
		}
		if set {
			s.raiseLive(b.PassAt) // after the slot: a reader that sees the mark finds the block
			return true, nil
		}
		s.Retries++
	}
	s.Lost++
	return false, nil
}

// encode appends the value of block b of shared key k to dst:
//
//	version, PassAt, RetryAt, Cost, hasLimit, algorithm, limit, window,
//	burst, name length (uint16), name, then the key
//
// integers little endian. A name longer than precheck.MaxNameLen is left
// out, as the precheck's table leaves it out.
func encode(dst []byte, b precheck.Block, k []byte) []byte {
	dst = append(dst, version)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(b.PassAt))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(b.RetryAt))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(b.Cost))
	has := byte(0)
	if b.HasLimit {
		has = 1
	}
	dst = append(dst, has, byte(b.Limit.Algorithm))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(b.Limit.Limit))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(b.Limit.Window))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(b.Limit.Burst))
	name := b.Name
	if len(name) > precheck.MaxNameLen {
		name = ""
	}
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(name)))
	dst = append(dst, name...)
	return append(dst, k...)
}

// decode reads a value that encode wrote: the block (its Name pointing
// into v) and the shared key. ok is false for anything else.
func decode(v []byte) (b precheck.Block, k []byte, ok bool) {
	if len(v) < header || len(v) > MaxValue || v[0] != version || v[25] > 1 {
		return precheck.Block{}, nil, false
	}
	u := func(i int) int64 { return int64(binary.LittleEndian.Uint64(v[i:])) }
	b = precheck.Block{PassAt: u(1), RetryAt: u(9), Cost: u(17), HasLimit: v[25] == 1,
		Limit: precheck.Limit{Algorithm: algorithms.Kind(v[26]), Limit: u(27), Window: u(35), Burst: u(43)}}
	n := int(binary.LittleEndian.Uint16(v[51:]))
	if n > precheck.MaxNameLen || header+n > len(v) {
		return precheck.Block{}, nil, false
	}
	b.Name = bytesString(v[header : header+n])
	return b, v[header+n:], true
}
