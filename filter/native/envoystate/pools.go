package envoystate

import (
	"bytes"
	"sync"
	"sync/atomic"

	"github.com/sluicehq/sluice/filter/core/lease"
)

// poolTable is one domain's lease pools (or one worker's, with
// shared_state off): a slot per pool, each with a lock of its own.
type poolTable struct {
	slots     [Slots]poolSlot
	announced atomic.Bool // a worker received a lease (lease.Pools.Announce)
	caller    uint64
}

// poolSlot is one pool. Its fields are guarded by mu, but idle: a slot
// whose pool no key could use at or after idle (ended more than
// lease.Recent ago, no call under way) is skipped by the readers without
// the lock.
type poolSlot struct {
	mu                  sync.Mutex
	idle                atomic.Int64
	key                 []byte // up to MaxKeyLen, reused
	left, until, asking int64  // units, their end, a call under way until asking
}

// mine reports whether the slot's pool is key's (mu held).
func (s *poolSlot) mine(key []byte) bool { return s.until != 0 && bytes.Equal(s.key, key) }

// live reports whether the pool holds a unit valid at now (mu held).
func (s *poolSlot) live(now int64) bool { return s.left >= 1 && now < s.until }

// recent reports whether the pool is key's, live or ended within
// lease.Recent of now (mu held).
func (s *poolSlot) recent(key []byte, now int64) bool {
	return s.mine(key) && now-s.until < lease.Recent
}

// touch sets idle after a write (mu held).
func (s *poolSlot) touch() { s.idle.Store(max(s.until+lease.Recent, s.asking)) }

// Pools is one worker's view of a pool table: it implements lease.Pools,
// counting its own lost grants. It is not safe for concurrent use; the
// table is.
type Pools struct {
	t    *poolTable
	lost int
}

var _ lease.Pools = (*Pools)(nil)

// lock returns key's slot locked, or nil when key is too long or the slot
// is idle at now (now < 0: never idle).
func (p *Pools) lock(key []byte, now int64) *poolSlot {
	if len(key) > MaxKeyLen {
		return nil
	}
	s := &p.t.slots[slotOf(key)]
	if now >= 0 && now >= s.idle.Load() {
		return nil
	}
	s.mu.Lock()
	return s
}

// Caller implements lease.Pools.
func (p *Pools) Caller() uint64 { return p.t.caller }

// Announce implements lease.Pools.
func (p *Pools) Announce() error {
	p.t.announced.Store(true)
	return nil
}

// Announced implements lease.Pools.
func (p *Pools) Announced() bool { return p.t.announced.Load() }

// Refresh implements lease.Pools: nothing to read again.
func (p *Pools) Refresh() {}

// Take implements lease.Pools.
func (p *Pools) Take(key []byte, now int64) (lease.Took, error) {
	s := p.lock(key, now)
	if s == nil {
		return lease.Took{}, nil
	}
	defer s.mu.Unlock()
	if !s.recent(key, now) {
		return lease.Took{}, nil
	}
	took := lease.Took{Recent: true, Left: s.left, Until: s.until}
	if s.live(now) {
		s.left--
		took.OK, took.Left = true, s.left
	}
	return took, nil
}

// Grant implements lease.Pools.
func (p *Pools) Grant(key []byte, n, until, now int64) (bool, error) {
	return p.add(key, n, until, now, true), nil
}

// Give implements lease.Pools.
func (p *Pools) Give(key []byte, n, until, now int64) (bool, error) {
	return p.add(key, n, until, now, false), nil
}

// add is Grant (replace: the call asked ends) and Give: units add up in a
// live pool of key; another key's live pool stays; anything else is
// replaced.
func (p *Pools) add(key []byte, n, until, now int64, replace bool) bool {
	if n < 1 || now >= until {
		return false
	}
	s := p.lock(key, -1)
	if s == nil {
		p.lost++
		return false
	}
	defer s.mu.Unlock()
	mine := s.mine(key)
	switch {
	case mine && s.live(now):
		s.left, s.until = s.left+n, min(s.until, until)
	case s.live(now):
		// another key's live pool: it stays (replaced, the two keys'
		// grants would replace each other, every unit lost)
		p.lost++
		return false
	default:
		if !mine || replace {
			s.asking = 0
		}
		s.key = append(s.key[:0], key...)
		s.left, s.until = n, until
	}
	if replace {
		s.asking = 0 // a grant answers the call asked
	}
	s.touch()
	return true
}

// Covers implements lease.Pools.
func (p *Pools) Covers(key []byte, now int64) bool {
	s := p.lock(key, now)
	if s == nil {
		return false
	}
	defer s.mu.Unlock()
	return s.mine(key) && s.live(now)
}

// Holds implements lease.Pools.
func (p *Pools) Holds(key []byte, now int64) bool {
	s := p.lock(key, now)
	if s == nil {
		return false
	}
	defer s.mu.Unlock()
	return s.recent(key, now)
}

// Ask implements lease.Pools.
func (p *Pools) Ask(key []byte, now, deadline int64) (bool, error) {
	s := p.lock(key, now)
	if s == nil {
		return false, nil
	}
	defer s.mu.Unlock()
	switch {
	case !s.recent(key, now) || s.live(now):
		return false, nil
	case s.asking > now:
		return true, nil
	}
	s.asking = deadline
	s.touch()
	return false, nil
}

// Renew implements lease.Pools.
func (p *Pools) Renew(key []byte, now, deadline, low int64) (bool, error) {
	s := p.lock(key, now)
	if s == nil {
		return false, nil
	}
	defer s.mu.Unlock()
	left := s.left
	if now >= s.until {
		left = 0
	}
	if !s.recent(key, now) || s.asking > now || left >= low {
		return false, nil
	}
	s.asking = deadline
	s.touch()
	return true, nil
}

// Asking implements lease.Pools.
func (p *Pools) Asking(key []byte, now int64) bool {
	s := p.lock(key, now)
	if s == nil {
		return false
	}
	defer s.mu.Unlock()
	return s.mine(key) && s.asking > now
}

// Answered implements lease.Pools.
func (p *Pools) Answered(key []byte) error {
	s := p.lock(key, -1)
	if s == nil {
		return nil
	}
	defer s.mu.Unlock()
	if s.mine(key) {
		s.asking = 0
		s.touch()
	}
	return nil
}

// Contention implements lease.Pools: a locked slot loses no race, so only
// the grants and give-backs not stored count.
func (p *Pools) Contention() (retries, exhausted, lost int) { return 0, 0, p.lost }
