package algorithms

// Result is the outcome of one decision. Durations are in the unit of now.
type Result struct {
	// Allowed reports whether the request was admitted (and its cost taken).
	Allowed bool
	// Limit is the capacity: the most that can be admitted at one instant
	// by a full limiter.
	Limit int64
	// Remaining is how much could still be admitted now, after this decision.
	// It is never negative.
	Remaining int64
	// RetryAfter is, when the request was denied, how long until the same
	// request would be allowed if nothing else arrives. It is 0 when allowed.
	RetryAfter int64
	// ResetAfter is how long until the limiter is full again if nothing else
	// arrives; 0 when it is full now.
	ResetAfter int64
	// Wait is, for Reserve only, how long the caller must wait before it may
	// proceed. For a denied reservation it is the wait it would have needed.
	Wait int64
}

// LimitError reports an invalid limit parameter or cost. Field names the
// offending input; Problem says what is wrong with it.
type LimitError struct {
	Field   string
	Problem string
}

// Error implements error.
func (e *LimitError) Error() string { return "algorithms: " + e.Field + " " + e.Problem }

// The errors Validate and Allow return. They are values, so returning one
// allocates nothing; compare with errors.Is or ==.
var (
	ErrLimit          = &LimitError{"limit", "must be at least 1"}
	ErrWindow         = &LimitError{"window", "must be positive"}
	ErrWindowTooLong  = &LimitError{"window", "is too long: the arithmetic would overflow"}
	ErrRate           = &LimitError{"rate", "must be at least 1"}
	ErrPeriod         = &LimitError{"period", "must be positive"}
	ErrPeriodTooLong  = &LimitError{"period", "is too long for this burst: the arithmetic would overflow"}
	ErrBurst          = &LimitError{"burst", "must be at least 1"}
	ErrMaxBurst       = &LimitError{"max_burst", "must not be negative"}
	ErrCount          = &LimitError{"count", "must be at least 1"}
	ErrCountTooHigh   = &LimitError{"count", "is more than one per time unit of period: the emission interval would be zero"}
	ErrMaxWait        = &LimitError{"max_wait", "must not be negative"}
	ErrCostNegative   = &LimitError{"cost", "must not be negative"}
	ErrCostTooLarge   = &LimitError{"cost", "exceeds the limiter's capacity, so it could never be allowed"}
	ErrStateCapacity  = &LimitError{"state", "was not made by NewState for this limit (ring too small)"}
	ErrLimitTooLarge  = &LimitError{"limit", "is too large: the arithmetic would overflow"}
	ErrPeriods        = &LimitError{"periods", "must be in order: Prev < Start < End < Next"}
	ErrPeriodsTooLong = &LimitError{"periods", "span too long: the arithmetic would overflow"}
	ErrPeriodsNow     = &LimitError{"periods", "do not hold now: now must be within [Start, End)"}
)

// maxSpan bounds windows, periods and the spans derived from them, so that
// now plus a few of them cannot overflow int64 for any realistic clock
// (2^61 ns is 73 years).
const maxSpan = int64(1) << 61

// validateWindow validates the parameters of the windowed algorithms.
func validateWindow(limit, window int64) error {
	switch {
	case limit < 1:
		return ErrLimit
	case window <= 0:
		return ErrWindow
	case window > maxSpan:
		return ErrWindowTooLong
	}
	return nil
}

// validateRate validates the parameters of the refilling algorithms (token
// bucket and reserve), which count Burst*Period units.
func validateRate(rate, period, burst int64) error {
	switch {
	case rate < 1:
		return ErrRate
	case period <= 0:
		return ErrPeriod
	case burst < 1:
		return ErrBurst
	case period > maxSpan || burst > maxSpan/period:
		return ErrPeriodTooLong
	}
	return nil
}

// checkCost validates a request's cost against a capacity.
func checkCost(cost, capacity int64) error {
	if cost < 0 {
		return ErrCostNegative
	}
	if cost > capacity {
		return ErrCostTooLarge
	}
	return nil
}

// ceilDiv returns ceil(a/b) for a >= 0 and b > 0 without overflowing.
func ceilDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 {
		q++
	}
	return q
}

// nonNegative clamps n at 0: a limit lowered under existing state can leave
// more admitted than the new limit.
func nonNegative(n int64) int64 {
	if n < 0 {
		return 0
	}
	return n
}

// windowStart returns the start of the window of length w that contains t,
// i.e. floor(t/w)*w, also for negative t.
func windowStart(t, w int64) int64 {
	q := t / w
	if t%w != 0 && t < 0 {
		q--
	}
	return q * w
}
