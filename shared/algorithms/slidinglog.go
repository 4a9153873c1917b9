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
	if err := l.Validate(); err != nil {
		return Result{}, err
	}
	if err := checkCost(cost, l.Limit); err != nil {
		return Result{}, err
	}
	if int64(len(s.ring)) < l.Limit {
		return Result{}, ErrStateCapacity
	}
	// Entries at or before now-Window have left the window.
	edge := now - l.Window
	for s.n > 0 && s.ring[s.head].at <= edge {
		s.total -= s.ring[s.head].cost
		s.head = (s.head + 1) % len(s.ring)
		s.n--
	}
	r := Result{Limit: l.Limit}
	if s.total+cost <= l.Limit {
		r.Allowed = true
		if cost > 0 {
			s.push(now, cost)
		}
	} else {
		r.RetryAfter = s.freedAt(s.total+cost-l.Limit) + l.Window - now
	}
	r.Remaining = nonNegative(l.Limit - s.total)
	if s.n > 0 {
		r.ResetAfter = s.ring[(s.head+s.n-1)%len(s.ring)].at + l.Window - now
	}
	return r, nil
}

// push appends cost at t, merging it into the newest entry when that entry
// has the same time.
func (s *SlidingLogState) push(t, cost int64) {
	s.total += cost
	if s.n > 0 {
		last := &s.ring[(s.head+s.n-1)%len(s.ring)]
		if last.at == t {
			last.cost += cost
			return
		}
	}
	// The ring has room: every entry holds at least 1 and total <= len(ring).
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
	// Unreachable while cost <= Limit; answer the newest entry to stay safe.
	return s.ring[(s.head+s.n-1)%len(s.ring)].at
}
