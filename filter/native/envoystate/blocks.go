package envoystate

import (
	"bytes"
	"hash/maphash"
	"strings"
	"sync/atomic"

	"github.com/sluicehq/sluice/filter/core/precheck"
)

const (
	// Slots is the number of slots of each table of a domain: the most
	// blocks, and the most lease pools, the process holds for it at once.
	Slots = 4096
	// MaxKeyLen is the longest descriptor key a table holds; a longer one
	// stays in its worker (blocks) or gets no pool (leases).
	MaxKeyLen = precheck.MaxKeyLen
	// MaxAttempts bounds the compare-and-swap attempts of one block write.
	MaxAttempts = 3
)

// seed is the process's hash seed: every worker picks the same slot for a
// key, and no client can aim keys at one slot from outside.
var seed = maphash.MakeSeed()

// slotOf returns the slot index of key.
func slotOf(key []byte) uint64 { return maphash.Bytes(seed, key) & (Slots - 1) }

// blockTable is one domain's blocks: an immutable entry per slot, replaced
// whole.
type blockTable struct {
	slots [Slots]atomic.Pointer[blockEntry]
	// live is the latest PassAt published: no slot holds a block live
	// after it, so a worker reads no slot while it has passed.
	live atomic.Int64
	// freed rises by one whenever a worker ends a block early (Unblock).
	freed atomic.Uint64
}

// blockEntry is what a block slot holds; never changed once stored.
type blockEntry struct {
	key   []byte
	block precheck.Block // its Name is the entry's own copy
}

// Blocks is one worker's view of a domain's blocks: it implements
// core.Blocks, counting its own contention. It is not safe for concurrent
// use (a worker is single-threaded); the table it reads is.
type Blocks struct {
	t             *blockTable
	retries, lost int
}

// MayHold reports whether a slot may hold a block live at now: one atomic
// read.
func (b *Blocks) MayHold(now int64) bool { return b.t.live.Load() > now }

// Lookup returns the block of key that has not passed at now.
func (b *Blocks) Lookup(key []byte, now int64) (precheck.Block, bool) {
	if len(key) > MaxKeyLen {
		return precheck.Block{}, false
	}
	e := b.t.slots[slotOf(key)].Load()
	if e == nil || e.block.PassAt <= now || !bytes.Equal(e.key, key) {
		return precheck.Block{}, false
	}
	return e.block, true
}

// Publish shares block blk of key, unless its slot already holds a block
// of key that lasts as long; false when it stays in this worker (every
// attempt lost to another writer, or the key is too long).
func (b *Blocks) Publish(key []byte, blk precheck.Block, now int64) (bool, error) {
	if blk.PassAt <= now || len(key) > MaxKeyLen {
		return false, nil
	}
	if len(blk.Name) > precheck.MaxNameLen {
		blk.Name = "" // as the precheck's table leaves it out
	}
	blk.Name = strings.Clone(blk.Name)
	e := &blockEntry{key: bytes.Clone(key), block: blk}
	slot := &b.t.slots[slotOf(key)]
	for range MaxAttempts {
		old := slot.Load()
		if old != nil && old.block.PassAt >= blk.PassAt && bytes.Equal(old.key, key) {
			b.raiseLive(old.block.PassAt)
			return true, nil
		}
		if slot.CompareAndSwap(old, e) {
			b.raiseLive(blk.PassAt) // after the slot: a reader that sees the mark finds the block
			return true, nil
		}
		b.retries++
	}
	b.lost++
	return false, nil
}

// raiseLive raises the table's live mark to passAt.
func (b *Blocks) raiseLive(passAt int64) {
	for {
		m := b.t.live.Load()
		if m >= passAt || b.t.live.CompareAndSwap(m, passAt) {
			return
		}
	}
}

// Unblock ends the block shared for key, if its slot holds one live at
// now, and raises the table's freed mark so that the workers drop the
// copies they keep: the control plane said a refund freed the key. A key
// without a live block changes nothing (most refunds).
func (b *Blocks) Unblock(key []byte, now int64) {
	if len(key) > MaxKeyLen {
		return
	}
	slot := &b.t.slots[slotOf(key)]
	for range MaxAttempts {
		old := slot.Load()
		if old == nil || old.block.PassAt <= now || !bytes.Equal(old.key, key) {
			return
		}
		if slot.CompareAndSwap(old, nil) {
			b.t.freed.Add(1)
			return
		}
		b.retries++
	}
	b.lost++
}

// Freed returns the table's freed mark: one atomic read.
func (b *Blocks) Freed(int64) uint64 { return b.t.freed.Load() }

// Refresh does nothing: the table is read directly.
func (b *Blocks) Refresh() {}

// Contention returns the writes of this view that lost a race and were
// tried again, and the blocks that stayed in its worker.
func (b *Blocks) Contention() (retries, lost int) { return b.retries, b.lost }
