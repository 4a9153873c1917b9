package core

import (
	"unsafe"

	"github.com/sluicehq/sluice/filter/core/descriptors"
	"github.com/sluicehq/sluice/filter/core/meter"
	"github.com/sluicehq/sluice/filter/core/rlsproto"
)

// Exchange states.
const (
	stateIdle      uint8 = iota // headers not seen yet
	statePending                // the control plane is being asked
	stateAnswering              // its answer is being applied; the request still waits
	stateHeld                   // admitted, held until releaseAt (shaping, see hold.go)
	stateWaiting                // waits for a call for the same descriptors (wait.go)
	stateDone                   // decided
	stateBody                   // its body is read for its reserve (tokens.go), before it is decided
)

// Exchange is the core's state of one stream: a request and its response.
// A host gets one from Worker.Open and passes it to the stream's hooks;
// the Worker keeps it (for reuse) once the host closed it and no call of
// it is under way.
type Exchange struct {
	w      *Worker
	stream Stream
	req    descriptors.Request // stream, converted once
	state  uint8
	closed bool // the host closed the stream; only the answer is awaited
	callID uint32
	// Shaping (hold.go): when the request was held and is to be resumed.
	heldAt, releaseAt int64
	sent
	// Headers to add to the response.
	response headerList
	// The usage-based limits' state (usage.go).
	usage streamUsage
	// LLM traffic (tokens.go): the stream's meter (nil when it has none);
	// the reserves its body sized, per rate limit, once sized; its cut
	// limits' budgets, per descriptor (aligned with costs); and the draws
	// of them under way (the exchange is kept until they are answered).
	meter    *meter.Stream
	reserves []uint32
	sized    bool
	bodyDue  int64 // when a body awaited is given up on
	budgets  []budget
	draws    int
	// Whether a waiting request waits for another worker's call (remote),
	// and whether its call is the one the workers wait for (asked); see
	// wait.go.
	remote, asked bool
}

// sent is what a call asked, one entry per descriptor, for its answer.
type sent struct {
	keys       []byte  // precheck keys, concatenated
	keyEnds    []int   // keys[keyEnds[i-1]:keyEnds[i]] is descriptor i's
	costs      []int64 // hits_addend
	rateLimits []int   // index of the configured rate limit
	sentAt     int64
}

// key returns descriptor i's precheck key.
func (s *sent) key(i int) []byte {
	start := 0
	if i > 0 {
		start = s.keyEnds[i-1]
	}
	return s.keys[start:s.keyEnds[i]]
}

// reset empties s for reuse.
func (s *sent) reset() {
	s.keys, s.keyEnds, s.costs, s.rateLimits, s.sentAt = s.keys[:0], s.keyEnds[:0], s.costs[:0], s.rateLimits[:0], 0
}

// reset readies x for a new stream of worker w.
func (x *Exchange) reset(w *Worker, s Stream) {
	x.w, x.state, x.closed, x.callID = w, stateIdle, false, 0
	if x.stream != s {
		x.stream, x.req = s, s
	}
	x.heldAt, x.releaseAt = 0, 0
	x.remote, x.asked = false, false
	x.sent.reset()
	x.response.reset()
	x.usage.reset()
	x.sized, x.budgets, x.draws = false, x.budgets[:0], 0
}

// Undecided reports whether x's request waits (for the control plane, for
// another call, held, or for its body to be read): a body chunk of it then
// goes to Worker.RequestBody, which holds it with the request. A host may
// let the body of a decided request go on without calling the core.
func (x *Exchange) Undecided() bool { return x.state != stateDone && x.state != stateIdle }

// ReadsResponse reports what the core reads of the response of x's stream:
// its headers (to add the rate limit headers, to read usage) and its body
// and trailers (usage). Until x is decided, both. A host may stop telling
// the core of the parts it does not read.
func (x *Exchange) ReadsResponse() (headers, body bool) {
	if x.state != stateDone {
		return true, true
	}
	return len(x.response.spans) != 0 || x.usage.armed, x.usage.armed
}

// AwaitsBody reports whether the request waits for its body before it is
// decided: a host whose pause also holds the body back (Envoy's
// StopAllIteration) must let the body reach the filter instead.
func (x *Exchange) AwaitsBody() bool { return x.state == stateBody }

// Answered takes the answer to x's call: it implements calls.Handler.
func (x *Exchange) Answered(a *rlsproto.Answer) { x.w.answered(x, a) }

// removeAt returns list without its element i, order kept, the vacated
// slot cleared (no stale reference keeps an exchange alive).
func removeAt(list []*Exchange, i int) []*Exchange {
	copy(list[i:], list[i+1:])
	list[len(list)-1] = nil
	return list[:len(list)-1]
}

func bufString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}
