package shareddata

import (
	"bytes"
	"encoding/binary"
	"strconv"

	"github.com/sluicehq/sluice/filter/core/lease"
)

// Leases is one plugin instance's view of the leases of its domain that the
// VMs of one proxy share: the requests the control plane granted in
// advance (RLS DescriptorStatus.quota) make one pool per descriptor for the
// whole proxy, whichever VM received them, instead of one share per VM.
//
// A pool lives in a slot of its own table ("sluice.leases.<n>", LeaseSlots
// of them, picked by the same hash and seed as the blocks'), holding the
// full key, the units left and the proxy's monotonic time they expire.
// Every unit was debited in the control plane's store before it was
// granted, so spending one admits nothing the global limit refuses; a unit
// lost (a slot another key overwrites, a give-back that cannot be stored)
// can only admit less.
//
// A unit is spent exactly once across VMs: Take reads the slot and writes
// it back one unit smaller with the CAS number it read, which the host
// refuses if any VM wrote the slot in between (a value that exists always
// has a CAS number other than 0). At most MaxAttempts such pairs; when all
// of them lose the race, Take reports no unit and the request calls the
// control plane, as it would with no lease (Exhausted counts those). Nobody
// waits on anybody.
type Leases struct {
	slots
	value []byte // scratch, reused by every write
	// Retries counts the CAS mismatches of writes; Exhausted the Takes
	// that lost every attempt (the request calls out); Lost the grants and
	// give-backs not stored (every attempt lost, or the slot holds another
	// key's live pool, or the host refused).
	Retries, Exhausted, Lost int
	// m is the lease map as this VM last read it (leasemap.go).
	m slotMap
}

var _ lease.Pools = (*Leases)(nil)

const (
	// LeaseSlots is the number of lease slots a plugin uses: the most
	// descriptors the proxy holds leases for at once.
	LeaseSlots = 4096
	// leaseHeader is the fixed part of a lease value (see encodeLease).
	leaseHeader = 1 + 8 + 8 + 8
	// MaxLeaseValue is the largest value of a lease slot.
	MaxLeaseValue = leaseHeader + MaxKeyLen
	// leaseVersion is the first byte of a lease value.
	leaseVersion = 3 // not a block's (version): no value is read as both
	// leasePrefix names the lease slots; onKey, once set, says that a VM
	// of the proxy received a lease.
	leasePrefix = "sluice.leases."
	onKey       = "sluice.leases.on"
)

// LeaseBound returns the most bytes of keys and values that slots lease
// slots can hold in the shared data (the host's per-entry overhead aside;
// the seed is counted in Bound).
func LeaseBound(slots int) int {
	return slots*(len(leasePrefix)+len(strconv.Itoa(slots-1))+MaxLeaseValue) + len(onKey) + 1 +
		len(mapKey) + 1 + mapLen(uint64(slots))
}

// Announce records in the shared data that a VM of the proxy received a
// lease, so that the others start reading the pools (Announced).
func (l *Leases) Announce() error {
	_, err := l.data.SetSharedData(onKey, []byte{1}, 0)
	return err
}

// Announced reports whether a VM of the proxy received a lease: one host
// call.
func (l *Leases) Announced() bool {
	_, _, found := l.data.SharedData(onKey)
	return found
}

// NewLeases returns the leases of domain over data with slots slots
// (rounded up to a power of two), sharing the blocks' hash seed.
func NewLeases(data Data, domain string, slots int) *Leases {
	return &Leases{slots: newSlots(data, domain, leasePrefix, slots)}
}

// pool is what a lease slot holds, as read.
type pool struct {
	left, until int64
	asking      int64 // a VM's call for the key is under way until then (Ask); 0: none
	cas         uint32
	found       bool // the slot has a value
	decoded     bool // ...which is a pool
	mine        bool // a pool of the key last named by slot
}

// live reports whether the pool holds a unit valid at now.
func (p pool) live(now int64) bool { return p.left >= 1 && now < p.until }

// load reads the slot that l.slot named at now, when the lease map says it
// may hold a pool (else it reads nothing and returns no pool). A slot that
// holds no pool any key could use loses its bit.
func (l *Leases) load(now int64) pool {
	if !l.mayHold(now) {
		return pool{}
	}
	p := l.read()
	if !p.found || !p.decoded || (now-p.until >= Recent && p.asking <= now) {
		l.unmark()
	}
	return p
}

// read reads the slot that l.slot named: one host call.
func (l *Leases) read() pool {
	v, cas, found := l.data.SharedData(bytesString(l.name))
	if !found {
		return pool{}
	}
	left, until, asking, k, ok := decodeLease(v)
	if !ok {
		return pool{cas: cas, found: true}
	}
	return pool{left: left, until: until, asking: asking, cas: cas, found: true, decoded: true, mine: bytes.Equal(k, l.key)}
}

// Covers reports whether key's pool holds a unit valid at now: one host
// call, changing nothing.
func (l *Leases) Covers(key []byte, now int64) bool {
	if !l.slot(key) {
		return false
	}
	p := l.load(now)
	return p.mine && p.live(now)
}

// Recent is how long after a pool of a key ends Holds and Ask still count
// the key as leased.
const Recent = lease.Recent

// recent reports whether p is a pool of the key named last that is live
// or ended within Recent of now.
func (p pool) recent(now int64) bool { return p.mine && now-p.until < Recent }

// Holds reports whether key's slot holds a pool of key, live or ended
// within Recent (the proxy receives leases for key, and no other key took
// the slot since): one host call, changing nothing.
func (l *Leases) Holds(key []byte, now int64) bool {
	return l.slot(key) && l.load(now).recent(now)
}

// Take spends one unit of key's pool valid at now: a read and a CAS write
// of the slot, at most MaxAttempts times. It returns what it read, with OK
// and the pool's expiry (for Give) when it took a unit; not OK when there
// is no unit (one read) or every attempt lost to another VM (Exhausted),
// or the host refused the write (err).
func (l *Leases) Take(key []byte, now int64) (lease.Took, error) {
	if !l.slot(key) {
		return lease.Took{}, nil
	}
	var took lease.Took
	for range MaxAttempts {
		p := l.load(now)
		took = lease.Took{Recent: p.recent(now), Left: p.left, Until: p.until}
		if !p.mine || !p.live(now) || p.cas == 0 {
			return took, nil
		}
		l.value = encodeLease(l.value[:0], p.left-1, p.until, p.asking, l.key)
		set, err := l.data.SetSharedData(bytesString(l.name), l.value, p.cas)
		if err != nil {
			return took, err
		}
		if set {
			took.OK, took.Left = true, p.left-1
			return took, nil
		}
		l.Retries++
	}
	l.Exhausted++
	return took, nil
}

// Grant adds n units valid until until to key's pool: to a live pool of
// key they add up, ending at the earlier expiry; another key's live pool
// stays (false: the units are lost); any other value of the slot (a spent
// or expired pool) is replaced. false also when every attempt lost the
// race, or err.
func (l *Leases) Grant(key []byte, n, until, now int64) (bool, error) {
	return l.add(key, n, until, now, true)
}

// Give returns n units that Take took from key's pool with expiry until
// and that were not spent (a request of several descriptors that could not
// take all of them). They go back only into a live pool of key, or into
// the slot if it is empty, spent or expired; never over another key's live
// pool. false: they are lost.
func (l *Leases) Give(key []byte, n, until, now int64) (bool, error) {
	return l.add(key, n, until, now, false)
}

// add is Grant (replace true: the call asked ends) and Give.
func (l *Leases) add(key []byte, n, until, now int64, replace bool) (bool, error) {
	if n < 1 || now >= until || !l.slot(key) {
		return false, nil
	}
	for range MaxAttempts {
		p := l.read()
		left, end, asking := n, until, int64(0) // a grant answers the call asked
		switch {
		case p.mine && p.live(now):
			left, end = p.left+n, min(p.until, until)
		case p.live(now):
			// another key's live pool: it stays (replaced, the two keys'
			// grants would replace each other, every unit lost)
			l.Lost++
			return false, nil
		}
		if !replace && p.mine {
			asking = p.asking // a give-back answers nothing
		}
		// A slot with no value is set whatever the CAS (0): two VMs
		// filling an empty slot at once may both succeed, the later
		// overwriting the earlier. That loses units, never makes one up.
		l.value = encodeLease(l.value[:0], left, end, asking, l.key)
		set, err := l.data.SetSharedData(bytesString(l.name), l.value, p.cas)
		if err != nil {
			l.Lost++
			return false, err
		}
		if set {
			l.mark(now)
			return true, nil
		}
		l.Retries++
	}
	l.Lost++
	return false, nil
}

// encodeLease appends the value of a pool of left units until until of
// shared key k, with a call asked until asking, to dst: version, left,
// until, asking (little endian), then the key.
func encodeLease(dst []byte, left, until, asking int64, k []byte) []byte {
	dst = append(dst, leaseVersion)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(left))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(until))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(asking))
	return append(dst, k...)
}

// decodeLease reads a value that encodeLease wrote; ok is false for
// anything else.
func decodeLease(v []byte) (left, until, asking int64, k []byte, ok bool) {
	if len(v) < leaseHeader || len(v) > MaxLeaseValue || v[0] != leaseVersion {
		return 0, 0, 0, nil, false
	}
	left = int64(binary.LittleEndian.Uint64(v[1:]))
	until = int64(binary.LittleEndian.Uint64(v[9:]))
	asking = int64(binary.LittleEndian.Uint64(v[17:]))
	if left < 0 {
		return 0, 0, 0, nil, false
	}
	return left, until, asking, v[leaseHeader:], true
}

// Ask is called by a VM whose request found key's pool without a unit at
// now and is about to call the control plane. When another VM's call for
// key is under way (asked until a time after now), it reports true: the
// request may wait for that call's grant (Asking) instead of calling.
// Otherwise it records this VM's call as under way until deadline (the
// call's timeout) and reports false: the request calls, and other VMs'
// requests wait for it. Only for a pool of key that Holds: any other
// reports false and records nothing. A grant (Grant)
// ends the ask; a call that brings none ends it with Answered.
func (l *Leases) Ask(key []byte, now, deadline int64) (bool, error) {
	if !l.slot(key) {
		return false, nil
	}
	for range MaxAttempts {
		p := l.load(now)
		switch {
		case !p.recent(now) || p.live(now):
			return false, nil
		case p.asking > now:
			return true, nil
		}
		l.value = encodeLease(l.value[:0], p.left, p.until, deadline, l.key)
		set, err := l.data.SetSharedData(bytesString(l.name), l.value, p.cas)
		if err != nil || set {
			return false, err
		}
		l.Retries++
	}
	return false, nil
}

// Renew records a renewal of key's pool (prefetch) as the call under way
// until deadline, as Ask does for a request's call, and reports true: the
// caller then sends it, and requests that find the pool without a unit wait
// for it. Only for a pool of key that is live or ended within Recent (a key
// the proxy receives leases for), that holds fewer than low units valid at
// now (low 1: none), and for which no call is under way (asked until after
// now): one renewal per key across the proxy's VMs at a time. Otherwise it
// records nothing and reports false. A grant (Grant) ends the renewal; one
// that brings none ends it with Answered.
func (l *Leases) Renew(key []byte, now, deadline, low int64) (bool, error) {
	if !l.slot(key) {
		return false, nil
	}
	for range MaxAttempts {
		p := l.load(now)
		left := p.left
		if now >= p.until {
			left = 0
		}
		if !p.recent(now) || p.asking > now || left >= low || p.cas == 0 {
			return false, nil
		}
		l.value = encodeLease(l.value[:0], p.left, p.until, deadline, l.key)
		set, err := l.data.SetSharedData(bytesString(l.name), l.value, p.cas)
		if err != nil {
			return false, err
		}
		if set {
			return true, nil
		}
		l.Retries++
	}
	return false, nil
}

// Caller implements lease.Pools: the proxy's number, from its seed.
func (l *Leases) Caller() uint64 { return l.Proxy() }

// Refresh implements lease.Pools: it reads the proxy's hash seed (two VMs
// that set a seed at once converge).
func (l *Leases) Refresh() { l.RefreshSeed() }

// Contention implements lease.Pools.
func (l *Leases) Contention() (retries, exhausted, lost int) { return l.Retries, l.Exhausted, l.Lost }

// Asking reports whether a VM's call for key is under way at now (Ask):
// one read.
func (l *Leases) Asking(key []byte, now int64) bool {
	if !l.slot(key) {
		return false
	}
	p := l.load(now)
	return p.mine && p.asking > now
}

// Answered ends a call asked for key (Ask) that brought no grant, so that
// the requests waiting for it call themselves: one read, and a write if
// a call is asked.
func (l *Leases) Answered(key []byte) error {
	if !l.slot(key) {
		return nil
	}
	for range MaxAttempts {
		p := l.load(l.m.readAt) // (the time of the map as read: an Ask read it)
		if !p.mine || p.asking == 0 {
			return nil
		}
		l.value = encodeLease(l.value[:0], p.left, p.until, 0, l.key)
		set, err := l.data.SetSharedData(bytesString(l.name), l.value, p.cas)
		if err != nil || set {
			return err
		}
		l.Retries++
	}
	return nil
}
