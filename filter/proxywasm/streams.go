package main

// streamTable maps the proxy's context ids to streams. Every request
// creates, finds and deletes its stream, so this replaces a
// map[uint32]*stream, whose operations cost over a hundred nanoseconds
// each in filter.wasm: open addressing with linear probing, Fibonacci
// hashing of the id (the proxy numbers contexts sequentially), deletion by
// backward shift (no tombstones), at most half full. The zero value is an
// empty table.
type streamTable struct {
	slots []streamSlot // a power of two long
	count int          // streams in the table
}

// streamSlot is one slot of a streamTable; s is nil when the slot is free.
type streamSlot struct {
	id uint32
	s  *stream
}

// minStreamSlots is the smallest table.
const minStreamSlots = 16

// home returns the first slot to probe for id.
func (t *streamTable) home(id uint32) uint64 {
	return (uint64(id) * 0x9e3779b97f4a7c15) >> 32 & uint64(len(t.slots)-1)
}

// get returns the stream of id, or nil.
func (t *streamTable) get(id uint32) *stream {
	if t.count == 0 {
		return nil
	}
	mask := uint64(len(t.slots) - 1)
	for p := t.home(id); ; p = (p + 1) & mask {
		sl := &t.slots[p]
		if sl.s == nil {
			return nil
		}
		if sl.id == id {
			return sl.s
		}
	}
}

// put sets the stream of id (s is not nil).
func (t *streamTable) put(id uint32, s *stream) {
	if 2*(t.count+1) > len(t.slots) {
		t.grow()
	}
	mask := uint64(len(t.slots) - 1)
	p := t.home(id)
	for ; t.slots[p].s != nil; p = (p + 1) & mask {
		if t.slots[p].id == id {
			t.slots[p].s = s
			return
		}
	}
	t.slots[p] = streamSlot{id: id, s: s}
	t.count++
}

// grow doubles the table (or makes the first one).
func (t *streamTable) grow() {
	old := t.slots
	t.slots = make([]streamSlot, max(minStreamSlots, 2*len(old)))
	mask := uint64(len(t.slots) - 1)
	for _, sl := range old {
		if sl.s == nil {
			continue
		}
		p := t.home(sl.id)
		for t.slots[p].s != nil {
			p = (p + 1) & mask
		}
		t.slots[p] = sl
	}
}

// remove removes id's stream and returns it, or nil if id has none. The
// slots after it in its run move back into the hole where their probe
// sequence allows, so that every id stays reachable from its home slot.
func (t *streamTable) remove(id uint32) *stream {
	if t.count == 0 {
		return nil
	}
	mask := uint64(len(t.slots) - 1)
	p := t.home(id)
	for t.slots[p].id != id {
		if t.slots[p].s == nil {
			return nil
		}
		p = (p + 1) & mask
	}
	removed := t.slots[p].s
	if removed == nil {
		return nil
	}
	t.count--
	for {
		t.slots[p] = streamSlot{}
		q := p
		for {
			q = (q + 1) & mask
			sl := t.slots[q]
			if sl.s == nil {
				return removed
			}
			// The id at q may fill the hole at p if p lies on its probe
			// sequence, between its home slot and q.
			if (q-t.home(sl.id))&mask >= (q-p)&mask {
				t.slots[p] = sl
				p = q
				break
			}
		}
	}
}

// len returns the number of streams in the table.
func (t *streamTable) len() int { return t.count }
