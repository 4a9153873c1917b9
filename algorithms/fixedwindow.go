package algorithms

// FixedWindow admits at most Limit per window of length Window.
//
// With Aligned set, windows are aligned to the clock (every multiple of
// Window starts one), as envoyproxy/ratelimit keys them. Otherwise a window
// starts at the first hit after the previous one ended, the INCR+EXPIRE
// pattern: the first INCR creates the key and sets its expiry. With Periods
// set, the windows are those periods (calendar days, weeks, months, years),
// aligned like Aligned ones, and Window is not used.
//
// Within one window the count is exact, but a client can pass Limit at the end
// of one window and Limit again at the start of the next: up to 2*Limit within
// an arbitrarily short interval across a boundary.
//
// ResetAfter of an aligned window is the time until the window ends, also
// when nothing was counted in it yet (as envoyproxy/ratelimit answers); a
// first-hit window that is not open answers 0.
type FixedWindow struct {
	Limit   int64    // requests admitted per window, >= 1
	Window  int64    // window length, > 0
	Aligned bool     // windows start at multiples of Window (else at the first hit)
	Periods *Periods // when set, the windows around now (calendar windows)
}

// FixedWindowState is a fixed window's state: the window that holds the count.
type FixedWindowState struct {
	Start int64 // when the current window started
	Count int64 // cost admitted in it; 0 means no window is open
}

// Validate reports whether the parameters are usable.
func (l FixedWindow) Validate() error {
	if err := validateWindow(l.Limit, l.Window); err != nil {
		return err
	}
	if l.Periods != nil {
		return l.Periods.validate(l.Periods.Start, maxSpan)
	}
	return nil
}

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

// Refund gives back amount of what the current window counted: the count
// falls by amount, never below 0 (see refund.go).
func (l FixedWindow) Refund(s *FixedWindowState, now, amount int64) (Result, error) {
	return refundOn(l, s, now, amount)
}

// check validates l at now: any state fits l.
func (l FixedWindow) check(_ *FixedWindowState, now int64) error {
	if err := validateWindow(l.Limit, l.Window); err != nil {
		return err
	}
	if l.Periods != nil {
		return l.Periods.validate(now, maxSpan)
	}
	return nil
}

// capacity is the largest cost a request may have.
func (l FixedWindow) capacity() int64 { return l.Limit }

// open returns the window that counts at now and its count: the state's
// when it is still open, else a new one (with count 0), and when it ends.
func (l FixedWindow) open(s *FixedWindowState, now int64) (start, count, end int64) {
	start, count = s.Start, s.Count
	if l.Aligned || l.Periods != nil {
		_, ws, we, wn := span(l.Periods, l.Window, now)
		if ws > start || count == 0 {
			start, count = ws, 0
		}
		end, _ = later(start, ws, we, wn)
		return start, count, end
	}
	if count == 0 || now >= start+l.Window {
		start, count = now, 0
	}
	return start, count, start + l.Window
}

// decide is Allow, Probe and Charge: the request is allowed if need fits; an
// allowed request, or any charge, takes take.
func (l FixedWindow) decide(s *FixedWindowState, now, need, take int64, charge bool) Result {
	start, count, end := l.open(s, now)
	r := Result{Limit: l.Limit, Allowed: count+need <= l.Limit}
	if r.Allowed || charge {
		count = capped(count, take, 2*l.Limit)
		s.Start, s.Count = start, count
	}
	if !r.Allowed {
		r.RetryAfter = end - now
	}
	r.Remaining = nonNegative(l.Limit - count)
	if count > 0 || l.Aligned || l.Periods != nil {
		r.ResetAfter = end - now
	}
	return r
}

// refund takes amount off the count of the window open at now.
func (l FixedWindow) refund(s *FixedWindowState, now, amount int64) {
	start, count, _ := l.open(s, now)
	s.Start, s.Count = start, max(0, count-amount)
}
