package algorithms

// FixedWindow admits at most Limit per window of length Window.
//
// With Aligned set, windows are aligned to the clock (every multiple of
// Window starts one), as envoyproxy/ratelimit keys them. Otherwise a window
// starts at the first hit after the previous one ended, the INCR+EXPIRE
// pattern: the first INCR creates the key and sets its expiry.
//
// Within one window the count is exact, but a client can pass Limit at the end
// of one window and Limit again at the start of the next: up to 2*Limit within
// an arbitrarily short interval across a boundary.
type FixedWindow struct {
	Limit   int64 // requests admitted per window, >= 1
	Window  int64 // window length, > 0
	Aligned bool  // windows start at multiples of Window (else at the first hit)
}

// FixedWindowState is a fixed window's state: the window that holds the count.
type FixedWindowState struct {
	Start int64 // when the current window started
	Count int64 // cost admitted in it; 0 means no window is open
}

// Validate reports whether the parameters are usable.
func (l FixedWindow) Validate() error { return validateWindow(l.Limit, l.Window) }

// Allow decides a request of the given cost at now.
func (l FixedWindow) Allow(s *FixedWindowState, now, cost int64) (Result, error) {
	return allowOn(l, s, now, cost)
}

// Probe reports whether a request of cost 1 would be allowed at now, taking
// nothing (see usage.go).
func (l FixedWindow) Probe(s *FixedWindowState, now int64) (Result, error) {
	return probeOn(l, s, now)
}

// Charge takes cost at now even past the limit (see usage.go).
func (l FixedWindow) Charge(s *FixedWindowState, now, cost int64) (Result, error) {
	return chargeOn(l, s, now, cost)
}

// check is Validate: any state fits l.
func (l FixedWindow) check(*FixedWindowState) error { return l.Validate() }

// capacity is the largest cost a request may have.
func (l FixedWindow) capacity() int64 { return l.Limit }

// decide is Allow, Probe and Charge: the request is allowed if need fits; an
// allowed request, or any charge, takes take.
func (l FixedWindow) decide(s *FixedWindowState, now, need, take int64, charge bool) Result {
	start, count := s.Start, s.Count
	if l.Aligned {
		if ws := windowStart(now, l.Window); ws > start || count == 0 {
			start, count = ws, 0
		}
	} else if count == 0 || now >= start+l.Window {
		start, count = now, 0
	}
	end := start + l.Window
	r := Result{Limit: l.Limit, Allowed: count+need <= l.Limit}
	if r.Allowed || charge {
		count = capped(count, take, 2*l.Limit)
		s.Start, s.Count = start, count
	}
	if !r.Allowed {
		r.RetryAfter = end - now
	}
	r.Remaining = nonNegative(l.Limit - count)
	if count > 0 {
		r.ResetAfter = end - now
	}
	return r
}
