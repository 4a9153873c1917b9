package algorithms

// Periods are the windows around now of a limit whose windows are not all
// of one length: calendar days, weeks, months or years in a time zone,
// which a daylight-saving change or the calendar makes longer or shorter
// (controlplane/calendar computes them). The window that holds now is
// [Start, End); the one before it starts at Prev, the one after it ends at
// Next.
//
// FixedWindow, SlidingWindow and SlidingLog take a *Periods (nil: windows
// of the limit's Window, aligned to the clock). They are an input of every
// call, like now, and must be the ones around that call's now: the
// functions stay pure, and the caller, which knows the calendar and the
// time zone, computes them (once per window, and shares them: the
// functions never modify them).
type Periods struct {
	Prev, Start, End, Next int64
}

// validate checks that p is usable at now, with periods of at most most
// each.
func (p *Periods) validate(now, most int64) error {
	switch {
	case !(p.Prev < p.Start && p.Start < p.End && p.End < p.Next):
		return ErrPeriods
	case p.Next-p.Prev > maxSpan || p.Next-p.Prev < 0: // the second: overflow
		return ErrPeriodsTooLong
	case p.Start-p.Prev > most || p.End-p.Start > most || p.Next-p.End > most:
		return ErrPeriodsTooLong
	case now < p.Start || now >= p.End:
		return ErrPeriodsNow
	}
	return nil
}

// span returns the window that holds now, [start, end), the start of the
// window before it and the end of the one after it, for fixed windows of
// length w or for p.
func span(p *Periods, w, now int64) (prev, start, end, next int64) {
	if p != nil {
		return p.Prev, p.Start, p.End, p.Next
	}
	start = windowStart(now, w)
	return start - w, start, start + w, start + 2*w
}

// later returns the end of the window that starts at start, and the length
// of the window after it, when start is not before the window that holds
// now (start, end, next from span): a state from a later window is one a
// clock that stepped back left. Past the window after now's, periods are
// not known: such a window is taken to be as long as now's.
func later(start, ws, we, wn int64) (end, nextLen int64) {
	switch {
	case start == ws:
		return we, wn - we
	case start == we:
		return wn, we - ws
	}
	return start + (we - ws), we - ws
}
