package host

import (
	"sync"
)

// sharedData is the key-value store every VM of a Host shares, with
// compare-and-swap, following proxy-wasm-cpp-host's SharedData: every
// successful set gives the entry a new, never-zero CAS value from one
// host-wide sequence; a set with cas 0 always succeeds; a set with a non-zero
// cas on an existing key must match its CAS value; a set on a missing key
// succeeds whatever the cas.
type sharedData struct {
	mu      sync.Mutex             // guards entries and nextCAS
	entries map[string]sharedEntry // by key
	nextCAS uint32                 // next CAS value to hand out (never 0)
}

// sharedEntry is one value and its CAS.
type sharedEntry struct {
	value []byte // owned copy
	cas   uint32 // changes on every set
}

// newSharedData returns an empty store.
func newSharedData() *sharedData {
	return &sharedData{entries: make(map[string]sharedEntry), nextCAS: 1}
}

// get returns a copy of the value and its CAS.
func (s *sharedData) get(key string) ([]byte, uint32, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.entries[key]
	if !ok {
		return nil, 0, false
	}
	return append([]byte(nil), e.value...), e.cas, true
}

// set stores a copy of value under key if cas allows it.
func (s *sharedData) set(key string, value []byte, cas uint32) Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.entries[key]; ok && cas != 0 && cas != e.cas {
		return StatusCasMismatch
	}
	next := s.nextCAS
	s.nextCAS++
	if s.nextCAS == 0 {
		s.nextCAS = 1
	}
	s.entries[key] = sharedEntry{value: append([]byte(nil), value...), cas: next}
	return StatusOK
}

// sharedQueues are the named queues of proxy_register_shared_queue. As in
// proxy-wasm-cpp-host, a name maps to one token for the life of the host, and
// proxy_on_queue_ready goes to the root context of the VM that registered the
// queue last.
type sharedQueues struct {
	mu     sync.Mutex              // guards all fields
	tokens map[string]uint32       // name -> token
	queues map[uint32]*sharedQueue // token -> queue
	next   uint32                  // last token handed out
}

// sharedQueue is one queue.
type sharedQueue struct {
	items [][]byte // FIFO
	owner *VM      // receives proxy_on_queue_ready
}

// newSharedQueues returns an empty set of queues.
func newSharedQueues() *sharedQueues {
	return &sharedQueues{tokens: make(map[string]uint32), queues: make(map[uint32]*sharedQueue)}
}

// register opens or creates the queue name, making vm its owner.
func (q *sharedQueues) register(name string, vm *VM) uint32 {
	q.mu.Lock()
	defer q.mu.Unlock()
	tok, ok := q.tokens[name]
	if !ok {
		q.next++
		tok = q.next
		q.tokens[name] = tok
		q.queues[tok] = &sharedQueue{}
	}
	q.queues[tok].owner = vm
	return tok
}

// resolve finds the token of an existing queue.
func (q *sharedQueues) resolve(name string) (uint32, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	tok, ok := q.tokens[name]
	return tok, ok
}

// enqueue appends a copy of value and returns the VM to notify.
func (q *sharedQueues) enqueue(tok uint32, value []byte) (*VM, Status) {
	q.mu.Lock()
	defer q.mu.Unlock()
	sq, ok := q.queues[tok]
	if !ok {
		return nil, StatusNotFound
	}
	sq.items = append(sq.items, append([]byte(nil), value...))
	return sq.owner, StatusOK
}

// dequeue pops the oldest item.
func (q *sharedQueues) dequeue(tok uint32) ([]byte, Status) {
	q.mu.Lock()
	defer q.mu.Unlock()
	sq, ok := q.queues[tok]
	if !ok {
		return nil, StatusNotFound
	}
	if len(sq.items) == 0 {
		return nil, StatusEmpty
	}
	v := sq.items[0]
	sq.items[0] = nil
	sq.items = sq.items[1:]
	return v, StatusOK
}
