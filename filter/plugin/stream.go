package plugin

import "unsafe"

// Stream states.
const (
	stateIdle      uint8 = iota // headers not seen yet
	statePending                // the control plane is being asked
	stateAnswering              // its answer is being applied; the request still waits
	stateHeld                   // admitted, held until releaseAt (shaping, see hold.go)
	stateWaiting                // waits for another request's call for the same descriptors (wait.go)
	stateDone                   // decided
)

// stream is one HTTP request/response pair.
type stream struct {
	id      uint32
	plugin  *Plugin
	state   uint8
	deleted bool // the proxy deleted the context; only the answer is awaited
	callID  uint32
	sentAt  int64
	// Shaping (hold.go): when the request was held and is to be resumed.
	heldAt, releaseAt int64
	// What was sent, one entry per descriptor, for the answer.
	keys       []byte  // precheck keys, concatenated
	keyEnds    []int   // keys[keyEnds[i-1]:keyEnds[i]] is descriptor i's
	costs      []int64 // hits_addend
	rateLimits []int   // index of the configured rate limit
	// Headers to add to the response.
	response headerList
	// The usage-based limits' state (usage.go).
	usage streamUsage
	// The call a waiting request makes if the call it waits for brings
	// no quota for it (wait.go); whether it waits for another VM's call
	// (remote), and whether its call is the one the VMs wait for (asked).
	frame         []byte
	remote, asked bool
}

func (s *stream) reset(id uint32, p *Plugin) {
	s.id, s.plugin, s.state, s.deleted, s.callID, s.sentAt = id, p, stateIdle, false, 0, 0
	s.heldAt, s.releaseAt = 0, 0
	s.remote, s.asked = false, false
	s.keys, s.keyEnds, s.costs, s.rateLimits = s.keys[:0], s.keyEnds[:0], s.costs[:0], s.rateLimits[:0]
	s.response.reset()
	s.usage.reset()
}

func (s *stream) key(i int) []byte {
	start := 0
	if i > 0 {
		start = s.keyEnds[i-1]
	}
	return s.keys[start:s.keyEnds[i]]
}

// headerList builds a list of headers whose names and values live in one
// buffer, so that they outlive the host memory they were copied from.
type headerList struct {
	buf   []byte
	spans [][4]int // name start, name end, value start, value end
	pairs [][2]string
}

func (h *headerList) reset() {
	h.buf, h.spans, h.pairs = h.buf[:0], h.spans[:0], h.pairs[:0]
}

// begin starts a header: append its value to h.buf, then call end.
func (h *headerList) begin(name string) {
	start := len(h.buf)
	h.buf = append(h.buf, name...)
	h.spans = append(h.spans, [4]int{start, len(h.buf), len(h.buf), 0})
}

func (h *headerList) end() { h.spans[len(h.spans)-1][3] = len(h.buf) }

func (h *headerList) add(name, value string) {
	h.begin(name)
	h.buf = append(h.buf, value...)
	h.end()
}

// list returns the headers; valid until the next reset.
func (h *headerList) list() [][2]string {
	h.pairs = h.pairs[:0]
	for _, sp := range h.spans {
		h.pairs = append(h.pairs, [2]string{bufString(h.buf[sp[0]:sp[1]]), bufString(h.buf[sp[2]:sp[3]])})
	}
	return h.pairs
}

func bufString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}
