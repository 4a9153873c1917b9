package algorithms

// SlidingLog admits at most Limit in every half-open interval (t-Window, t].
// It is exact: it remembers when each admitted request arrived, so its memory
// grows with Limit (one entry per admitted request still in the window, with
// requests of one instant merged).
//
// With Periods set (calendar days, weeks, months, years, which differ in
// length), an entry leaves the window one period after it arrived: at the
// same offset into the next period, or at that period's end when it is
// shorter (a request of January 30 leaves at the end of February). At now,
// the window is then (edge, now] with edge = Prev + min(now-Start,
// Start-Prev-1): the same time into the previous period as now is into the
// current one, or, once that period has ended, just before Start. The
// edge only moves forward, so the log is as exact as with fixed windows,
// and with periods all of one length W it is (now-W, now]. Window is not
// used then.
type SlidingLog struct {
	Limit   int64    // requests admitted per sliding window, >= 1
	Window  int64    // window length, > 0
	Periods *Periods // when set, the periods around now (calendar windows)
}

// logEntry is cost admitted at one instant.
type logEntry struct {
	at   int64
	cost int64
}

// SlidingLogState is the log of admitted requests: a ring of entries, oldest
// first. Make one with SlidingLog.NewState; the decision path never allocates.
type SlidingLogState struct {
	ring  []logEntry
	head  int   // index of the oldest entry
	n     int   // entries in use
	total int64 // sum of the costs in use
}

// NewState returns an empty log sized for l.Limit entries.
func (l SlidingLog) NewState() *SlidingLogState {
	n := l.Limit
	if n < 1 {
		n = 1
	}
	return &SlidingLogState{ring: make([]logEntry, n)}
}

// Total returns the cost currently held in the log (expired entries included
// until the next Allow prunes them).
func (s *SlidingLogState) Total() int64 { return s.total }

// Validate reports whether the parameters are usable.
func (l SlidingLog) Validate() error {
	if err := validateWindow(l.Limit, l.Window); err != nil {
		return err
	}
	if l.Periods != nil {
		return l.Periods.validate(l.Periods.Start, maxSpan)
	}
	return nil
}

// Allow decides a request of the given cost at now.
func (l SlidingLog) Allow(s *SlidingLogState, now, cost int64) (Result, error) {
	return allowOn(l, s, now, cost)
}

// Probe reports whether a request of cost 1 would be allowed at now, taking
// nothing (it does drop the entries that left the window; see usage.go).
func (l SlidingLog) Probe(s *SlidingLogState, now int64) (Result, error) {
	return probeOn(l, s, now)
}

// Charge takes cost at now even past the limit: it is logged like any entry
// and leaves the window Window later (see usage.go).
func (l SlidingLog) Charge(s *SlidingLogState, now, cost int64) (Result, error) {
	return chargeOn(l, s, now, cost)
}

// Refund removes amount from the newest entries (see refund.go).
func (l SlidingLog) Refund(s *SlidingLogState, now, amount int64) (Result, error) {
	return refundOn(l, s, now, amount)
}

// check validates l at now and that s was made for it.
func (l SlidingLog) check(s *SlidingLogState, now int64) error {
	if err := validateWindow(l.Limit, l.Window); err != nil {
		return err
	}
	if l.Periods != nil {
		if err := l.Periods.validate(now, maxSpan); err != nil {
			return err
		}
	}
	if int64(len(s.ring)) < l.Limit {
		return ErrStateCapacity
	}
	return nil
}

// edge returns the time at or before which an entry has left the window at
// now.
func (l SlidingLog) edge(now int64) int64 {
	if p := l.Periods; p != nil {
		// Short of Start until the period ends: an entry at Start leaves
		// at End, one period after it came.
		return p.Prev + min(now-p.Start, p.Start-p.Prev-1)
	}
	return now - l.Window
}

// Leaves returns when an entry that arrived at at leaves the window: at +
// Window, or with Periods (which must be the ones around the time of the
// question, and at no earlier than Prev) one period later, as SlidingLog
// says.
func (l SlidingLog) Leaves(at int64) int64 {
	p := l.Periods
	switch {
	case p == nil:
		return at + l.Window
	case at < p.Start:
		return min(p.Start+(at-p.Prev), p.End)
	}
	return min(p.End+(at-p.Start), p.Next)
}

// Arrival returns the earliest arrival whose entry leaves the window at
// leave or later (Leaves' inverse, for one entry that stands for several
// whose newest leaves at leave), with Periods around the time of the
// question; leave is after Start.
func (l SlidingLog) Arrival(leave int64) int64 {
	p := l.Periods
	switch {
	case p == nil:
		return leave - l.Window
	case leave < p.Start+(p.Start-p.Prev) && leave <= p.End:
		return p.Prev + (leave - p.Start)
	}
	return p.Start + max(0, leave-p.End)
}

// capacity is the largest cost a request may have.
func (l SlidingLog) capacity() int64 { return l.Limit }

// decide is Allow, Probe and Charge: the request is allowed if need fits; an
// allowed request, or any charge, logs take.
func (l SlidingLog) decide(s *SlidingLogState, now, need, take int64, charge bool) Result {
	s.prune(l.edge(now))
	r := Result{Limit: l.Limit, Allowed: s.total+need <= l.Limit}
	if r.Allowed || charge {
		if add := capped(s.total, take, 2*l.Limit) - s.total; add > 0 {
			s.push(now, add, int64(s.n) >= l.Limit)
		}
	}
	if !r.Allowed {
		if charge {
			need = 1 // the charge is taken: when would the next request pass
		}
		r.RetryAfter = l.Leaves(s.freedAt(s.total+need-l.Limit)) - now
	}
	r.Remaining = nonNegative(l.Limit - s.total)
	if s.n > 0 {
		r.ResetAfter = l.Leaves(s.ring[(s.head+s.n-1)%len(s.ring)].at) - now
	}
	return r
}

// refund removes amount from the newest entries still in the window.
func (l SlidingLog) refund(s *SlidingLogState, now, amount int64) {
	s.prune(l.edge(now))
	for amount > 0 && s.n > 0 {
		last := &s.ring[(s.head+s.n-1)%len(s.ring)]
		take := min(amount, last.cost)
		last.cost -= take
		s.total -= take
		amount -= take
		if last.cost == 0 {
			*last = logEntry{}
			s.n--
		}
	}
}

// prune drops the entries at or before edge: they have left the window.
func (s *SlidingLogState) prune(edge int64) {
	for s.n > 0 && s.ring[s.head].at <= edge {
		s.total -= s.ring[s.head].cost
		s.head = (s.head + 1) % len(s.ring)
		s.n--
	}
}

// Newest returns when the newest entry arrived; ok is false for an empty
// log. (Entries that left the window count until the next call prunes
// them.)
func (s *SlidingLogState) Newest() (at int64, ok bool) {
	if s.n == 0 {
		return 0, false
	}
	return s.ring[(s.head+s.n-1)%len(s.ring)].at, true
}

// push appends cost at t, merging it into the newest entry when that entry
// has the same time or when full (the log holds Limit entries: only a charge
// past the limit finds it so); a merged entry takes the later of the two
// times, so it leaves the window no earlier than the cost it stands for.
func (s *SlidingLogState) push(t, cost int64, full bool) {
	s.total += cost
	if s.n > 0 {
		last := &s.ring[(s.head+s.n-1)%len(s.ring)]
		if last.at == t || full {
			last.cost += cost
			last.at = max(last.at, t)
			return
		}
	}
	// The ring has room: it holds at least Limit entries, and there are
	// fewer (each holds at least 1, and a full log merges).
	s.ring[(s.head+s.n)%len(s.ring)] = logEntry{at: t, cost: cost}
	s.n++
}

// freedAt returns the arrival time of the entry whose expiry frees at least
// need: the oldest entries leave first.
func (s *SlidingLogState) freedAt(need int64) int64 {
	var freed int64
	for i := 0; i < s.n; i++ {
		e := s.ring[(s.head+i)%len(s.ring)]
		freed += e.cost
		if freed >= need {
			return e.at
		}
	}
	// Unreachable: need is at most the total; answer the newest entry to stay safe.
	return s.ring[(s.head+s.n-1)%len(s.ring)].at
}
