// Package calls is the table of a worker's calls to the control plane under
// way: one table, keyed by the call's id, whatever the call is for (a
// request's decision, a lease renewal, a settlement), each entry holding
// the Handler its answer goes to. The host delivers every answer, from
// whichever transport, in one form (rlsproto.Answer), so an answer is
// routed once, here.
package calls

import "github.com/sluicehq/sluice/filter/core/rlsproto"

// Handler takes the answer to a call.
type Handler interface {
	// Answered takes the answer to the call: a.Failure says why there is
	// none (a failure, or the call's deadline passed with no answer).
	Answered(a *rlsproto.Answer)
}

// NeverAnswered is the answer a call gets when its deadline passes and the
// proxy never delivered one (it should answer by the call's timeout).
var NeverAnswered = rlsproto.Answer{Failure: "the proxy never delivered the control plane's answer"}

// Table holds the calls under way. It is not safe for concurrent use (a
// worker is single-threaded). The zero value is an empty table.
type Table struct {
	m map[uint32]entry
}

type entry struct {
	h        Handler
	deadline int64 // past it, the call is given up on (Overdue)
}

// Add records call id, whose answer goes to h; past deadline (the
// monotonic clock) the call is overdue.
func (t *Table) Add(id uint32, h Handler, deadline int64) {
	if t.m == nil {
		t.m = make(map[uint32]entry)
	}
	t.m[id] = entry{h: h, deadline: deadline}
}

// Take removes call id and returns its handler; false when the call is not
// (or no longer) under way: given up on, or not one of this table's.
func (t *Table) Take(id uint32) (Handler, bool) {
	e, ok := t.m[id]
	if !ok {
		return nil, false
	}
	delete(t.m, id)
	return e.h, true
}

// Has reports whether call id is under way.
func (t *Table) Has(id uint32) bool {
	_, ok := t.m[id]
	return ok
}

// Remove forgets call id: its answer, if it comes, is ignored.
func (t *Table) Remove(id uint32) { delete(t.m, id) }

// Overdue removes the calls whose deadline is before now and appends their
// handlers to dst.
func (t *Table) Overdue(dst []Handler, now int64) []Handler {
	for id, e := range t.m {
		if now > e.deadline {
			delete(t.m, id)
			dst = append(dst, e.h)
		}
	}
	return dst
}

// Len returns the number of calls under way.
func (t *Table) Len() int { return len(t.m) }

// Clear forgets every call.
func (t *Table) Clear() { clear(t.m) }
