package shareddata

// The lease map: which lease slots may hold a pool, one bit a slot, in one
// shared-data key of the proxy. A request whose key's slot has no bit reads
// no slot at all, so that leases cost nothing to the requests they cannot
// help (a load spread over many keys, none of which gets a lease): a VM
// reads the map once per LiveRefresh at most, and a request then only
// tests a bit.
//
// A grant sets its slot's bit after it wrote the slot, and writes the map
// even when the bit is set already: a VM that clears the bit (a slot it
// read held no pool any key could use) does so with the CAS number of the
// map as it read it before reading the slot, so that a grant made since,
// whose write changed that number, keeps its bit. A bit a VM has not read
// yet (at most LiveRefresh) only makes its requests call the control plane
// instead of taking a unit: that admits less, never more.

const (
	// mapKey names the lease map; its value is mapVersion, then the bits.
	mapKey     = "sluice.leases.map"
	mapVersion = 1
)

// slotMap is a VM's copy of the lease map.
type slotMap struct {
	bits   []byte // one bit a slot, as last read (all clear when the map has none)
	cas    uint32 // its CAS number; 0: unknown (this VM wrote the map since)
	readAt int64  // when it was read
	read   bool
	value  []byte // scratch: a value to write
}

// mapLen returns the size of the bits of n slots.
func mapLen(n uint64) int { return int((n + 7) / 8) }

// has reports whether the copy's bit of slot i is set.
func (m *slotMap) has(i uint64) bool {
	return int(i/8) < len(m.bits) && m.bits[i/8]&(1<<(i%8)) != 0
}

// mayHold reports whether the slot that l.slot named may hold a pool, from
// the lease map as read at most LiveRefresh before now (one host call when
// it is read again).
func (l *Leases) mayHold(now int64) bool {
	m := &l.m
	if !m.read || now-m.readAt >= LiveRefresh || now < m.readAt {
		l.readMap(now)
	}
	return m.has(l.index)
}

// readMap reads the lease map into l.m at now.
func (l *Leases) readMap(now int64) {
	m := &l.m
	if m.bits == nil {
		m.bits = make([]byte, mapLen(l.mask+1))
	}
	m.read, m.readAt = true, now
	v, cas, found := l.data.SharedData(mapKey)
	if !found || len(v) != 1+len(m.bits) || v[0] != mapVersion {
		clear(m.bits)
		m.cas = cas // (0 when there is none: a first write sets it whatever)
		return
	}
	copy(m.bits, v[1:])
	m.cas = cas
}

// mark sets the bit of the slot that l.slot named in the lease map (a pool
// was just written to it), with at most MaxAttempts compare-and-swaps.
// When every attempt loses, the pool stays unseen by the VMs whose copy
// lacks its bit (until another grant to the slot): that admits less.
func (l *Leases) mark(now int64) {
	m := &l.m
	if m.bits == nil {
		m.bits = make([]byte, mapLen(l.mask+1))
	}
	for range MaxAttempts {
		v, cas, found := l.data.SharedData(mapKey)
		m.value = append(m.value[:0], mapVersion)
		if found && len(v) == 1+len(m.bits) && v[0] == mapVersion {
			m.value = append(m.value, v[1:]...)
		} else {
			m.value = append(m.value, make([]byte, len(m.bits))...)
			if !found {
				cas = 0
			}
		}
		m.value[1+l.index/8] |= 1 << (l.index % 8)
		set, err := l.data.SetSharedData(mapKey, m.value, cas)
		if err != nil {
			break
		}
		if set {
			copy(m.bits, m.value[1:])
			m.cas, m.read, m.readAt = 0, true, now
			return
		}
		l.Retries++
	}
	l.Lost++
}

// unmark clears the bit of the slot that l.slot named, which holds no pool
// any key could use, with the CAS number of the map this VM's copy was read
// with: a grant that marked the map since keeps its bit.
func (l *Leases) unmark() {
	m := &l.m
	if m.cas == 0 || !m.has(l.index) {
		return
	}
	m.value = append(append(m.value[:0], mapVersion), m.bits...)
	m.value[1+l.index/8] &^= 1 << (l.index % 8)
	if set, err := l.data.SetSharedData(mapKey, m.value, m.cas); err == nil && set {
		copy(m.bits, m.value[1:])
	}
	m.cas = 0 // written, or changed by another VM: known again at the next read
}
