package algorithms

// SlidingLog admits at most Limit in every half-open interval (t-Window, t].
// It is exact: it remembers when each admitted request arrived, so its memory
// grows with Limit (one entry per admitted request still in the window, with
// requests of one instant merged).
type SlidingLog struct {
	Limit  int64 // requests admitted per sliding window, >= 1
	Window int64 // window length, > 0
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
func (l SlidingLog) Validate() error { return validateWindow(l.Limit, l.Window) }

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

// check validates l and that s was made for it.
func (l SlidingLog) check(s *SlidingLogState) error {
	if err := l.Validate(); err != nil {
		return err
	}
	if int64(len(s.ring)) < l.Limit {
		return ErrStateCapacity
	}
	return nil
}

// capacity is the largest cost a request may have.
func (l SlidingLog) capacity() int64 { return l.Limit }

// decide is Allow, Probe and Charge: the request is allowed if need fits; an
// allowed request, or any charge, logs take.
func (l SlidingLog) decide(s *SlidingLogState, now, need, take int64, charge bool) Result {
	// Entries at or before now-Window have left the window.
	edge := now - l.Window
	for s.n > 0 && s.ring[s.head].at <= edge {
		s.total -= s.ring[s.head].cost
		s.head = (s.head + 1) % len(s.ring)
		s.n--
	}
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
		r.RetryAfter = s.freedAt(s.total+need-l.Limit) + l.Window - now
	}
	r.Remaining = nonNegative(l.Limit - s.total)
	if s.n > 0 {
		r.ResetAfter = s.ring[(s.head+s.n-1)%len(s.ring)].at + l.Window - now
	}
	return r
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
