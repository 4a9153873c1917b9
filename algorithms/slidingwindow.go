package algorithms

// weightScale is the resolution of the previous window's weight: weights are
// whole thousandths, rounded down, so that the Redis Lua port computes
// bit-for-bit the same integers (Lua numbers are doubles).
const weightScale = 1000

// maxWeighted bounds a window's length, which the weight multiplies by
// weightScale: 2^62/1000 (53 days in nanoseconds, a calendar month with
// room to spare) keeps the product within int64.
const maxWeighted = 2 * maxSpan / weightScale

// SlidingWindow is the sliding-window counter: two adjacent clock-aligned
// windows, the previous one weighted by how much of it the sliding window
// still covers. It needs O(1) memory, but it is approximate.
//
// At time now, with e = now - (start of the current window), it estimates the
// load of (now-Window, now] as
//
//	prev*w + cur, w = floor((Window-e)*1000/Window)/1000
//
// and admits a request if estimate+cost <= Limit. The estimate assumes the
// previous window's requests were spread evenly. Error bound: the current
// window's own count never exceeds Limit, so every clock-aligned window admits
// at most Limit; a sliding window (t-Window, t] spans two aligned windows, so
// at most 2*Limit, reached only when the previous window's requests all came
// at its very end. Rounding w down (by less than 1/1000) admits at most
// prev/1000 (< Limit/1000 + 1) more than the unrounded estimate would. For
// traffic spread evenly the estimate is exact up to that rounding.
//
// With Periods set, the windows are those periods (calendar days, weeks,
// months, years), which differ in length: the previous window's weight is
// the share of the current window still to come, (End-now)/(End-Start),
// and Window is not used.
type SlidingWindow struct {
	Limit   int64    // requests admitted per window, >= 1
	Window  int64    // window length, > 0
	Periods *Periods // when set, the windows around now (calendar windows)
}

// SlidingWindowState holds the counts of the current and previous windows.
type SlidingWindowState struct {
	Start int64 // start of the current window
	Prev  int64 // cost admitted in the window before Start
	Cur   int64 // cost admitted in the current window
}

// Validate reports whether the parameters are usable.
func (l SlidingWindow) Validate() error {
	if err := l.shape(); err != nil || l.Periods == nil {
		return err
	}
	return l.Periods.validate(l.Periods.Start, maxWeighted)
}

// shape validates the parameters but the periods.
func (l SlidingWindow) shape() error {
	switch {
	case l.Limit < 1:
		return ErrLimit
	case l.Limit > maxSpan/weightScale:
		return ErrLimitTooLarge
	case l.Window <= 0:
		return ErrWindow
	case l.Window > maxWeighted:
		return ErrWindowTooLong
	}
	return nil
}

// Allow decides a request of the given cost at now.
func (l SlidingWindow) Allow(s *SlidingWindowState, now, cost int64) (Result, error) {
	return allowOn(l, s, now, cost)
}

// Probe reports whether a request of cost 1 would be allowed at now, taking
// nothing (see usage.go).
func (l SlidingWindow) Probe(s *SlidingWindowState, now int64) (Result, error) {
	return probeOn(l, s, now)
}

// Charge takes cost at now even past the limit: the current window's count
// passes Limit and weighs on the next window (see usage.go).
func (l SlidingWindow) Charge(s *SlidingWindowState, now, cost int64) (Result, error) {
	return chargeOn(l, s, now, cost)
}

// Refund gives back amount of the current window's count, never below 0
// (see refund.go).
func (l SlidingWindow) Refund(s *SlidingWindowState, now, amount int64) (Result, error) {
	return refundOn(l, s, now, amount)
}

// check validates l at now: any state fits l.
func (l SlidingWindow) check(_ *SlidingWindowState, now int64) error {
	if err := l.shape(); err != nil || l.Periods == nil {
		return err
	}
	return l.Periods.validate(now, maxWeighted)
}

// capacity is the largest cost a request may have.
func (l SlidingWindow) capacity() int64 { return l.Limit }

// decide is Allow, Probe and Charge: the request is allowed if need fits the
// estimate; an allowed request, or any charge, takes take.
func (l SlidingWindow) decide(s *SlidingWindowState, now, need, take int64, charge bool) Result {
	start, prev, cur, length, nextLen := l.roll(*s, now)
	e := now - start
	scaled := prev*weight(e, length) + cur*weightScale // estimate * weightScale
	r := Result{Limit: l.Limit, Allowed: scaled+need*weightScale <= l.Limit*weightScale}
	if r.Allowed || charge {
		c := capped(cur, take, 2*l.Limit)
		scaled += (c - cur) * weightScale
		cur = c
		s.Start, s.Prev, s.Cur = start, prev, cur
	}
	if !r.Allowed {
		if charge {
			need = 1 // the charge is taken: when would the next request pass
		}
		r.RetryAfter = l.retryAfter(prev, cur, need, e, length, nextLen)
	}
	r.Remaining = nonNegative(l.Limit - ceilDiv(scaled, weightScale))
	switch {
	case cur > 0:
		r.ResetAfter = start + length + nextLen - now
	case prev > 0:
		r.ResetAfter = start + length - now
	}
	return r
}

// refund takes amount off the count of the window that holds now.
func (l SlidingWindow) refund(s *SlidingWindowState, now, amount int64) {
	start, prev, cur, _, _ := l.roll(*s, now)
	s.Start, s.Prev, s.Cur = start, prev, max(0, cur-amount)
}

// roll moves the state to the window that contains now, and returns that
// window's length and the length of the one after it.
func (l SlidingWindow) roll(s SlidingWindowState, now int64) (start, prev, cur, length, nextLen int64) {
	ps, ws, we, wn := span(l.Periods, l.Window, now)
	switch {
	case ws < s.Start && (s.Prev > 0 || s.Cur > 0):
		// The clock stepped back: keep counting in the later window.
		end, next := later(s.Start, ws, we, wn)
		return s.Start, s.Prev, s.Cur, end - s.Start, next
	case ws == s.Start && (s.Prev > 0 || s.Cur > 0):
		return ws, s.Prev, s.Cur, we - ws, wn - we // the same window
	case s.Start == ps:
		return ws, s.Cur, 0, we - ws, wn - we
	}
	return ws, 0, 0, we - ws, wn - we
}

// weight returns the previous window's weight in thousandths, e elapsed into
// the current window of the given length.
func weight(e, length int64) int64 {
	if e >= length {
		return 0
	}
	if e < 0 {
		e = 0
	}
	return (length - e) * weightScale / length
}

// retryAfter returns how long after now (e into the current window, of
// length, followed by one of nextLen) a request of cost fits, given prev
// and cur in this window and nothing else arriving.
func (l SlidingWindow) retryAfter(prev, cur, cost, e, length, nextLen int64) int64 {
	if cur+cost <= l.Limit {
		if at, ok := l.fitsAt(prev, cur, cost, length); ok && at > e {
			return at - e
		}
	}
	// Not in this window: in the next one, cur becomes the previous count.
	if at, ok := l.fitsAt(cur, 0, cost, nextLen); ok {
		return length - e + at
	}
	// A window shorter than 1000 time units can keep a weight >= 1/1000 to
	// its end; two windows on, both counts are gone.
	return length + nextLen - e
}

// fitsAt returns the earliest offset into a window of length w, with prev
// counted in the window before it and cur in it, at which a request of cost
// fits; ok is false when it fits nowhere in the window.
func (l SlidingWindow) fitsAt(prev, cur, cost, w int64) (at int64, ok bool) {
	room := (l.Limit - cur - cost) * weightScale // what prev*weight may use
	if prev == 0 {
		return 0, room >= 0
	}
	q := room / prev // largest weight that fits
	if q >= weightScale {
		return 0, true
	}
	// weight(e) <= q  <=>  (w-e)*1000 < (q+1)*w
	//                <=>  e > w - (q+1)*w/1000
	// smallest such e: w - ceil((q+1)*w/1000) + 1.
	at = w - ceilDiv((q+1)*w, weightScale) + 1
	if at < 0 {
		at = 0
	}
	return at, at < w
}
