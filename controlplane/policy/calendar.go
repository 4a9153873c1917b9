package policy

import (
	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/calendar"
)

// calendar parses the limit's calendar into l.Calendar: an IANA time zone
// in which l's unit counts calendar days, ISO weeks (from Monday), months
// and years. It takes unit day, week, month or year (no window, no
// unit_multiplier) and an algorithm with windows. It reports whether the
// field is valid; l.Unit and l.Algorithm are parsed already (algoOK and
// unitOK say whether they are valid).
func (p *parser) calendar(l *Limit, fs map[string]field, path string, algoOK, unitOK bool) bool {
	f, has := fs["calendar"]
	if !has {
		return true
	}
	fpath := join(path, "calendar")
	zone, ok := p.scalar(f, fpath)
	if !ok {
		return false
	}
	_, hasUnit := fs["unit"]
	_, hasMultiplier := fs["unit_multiplier"]
	switch {
	case !hasUnit:
		p.errorf(f.key.Line, fpath, "counts whole calendar units: use unit (day, week, month or year) rather than window")
		return false
	case hasMultiplier:
		p.errorf(f.key.Line, fpath, "takes no unit_multiplier: a calendar window is one day, week, month or year")
		return false
	case !unitOK || !algoOK:
		return true // their own errors say it all
	case !l.Unit.IsCalendar():
		p.errorf(f.key.Line, fpath, "takes unit day, week, month or year (got %s, whose windows are the same in every time zone: leave calendar out)", l.Unit.Name())
		return false
	case !l.Algorithm.HasWindows():
		p.errorf(f.key.Line, fpath,
			"applies to the algorithms with windows (fixed_window, sliding_window, sliding_log); %s refills at requests_per_unit at every instant, which no calendar boundary changes", l.Algorithm)
		return false
	case l.Algorithm == algorithms.KindSlidingWindow && l.Unit == algorithms.UnitYear:
		p.errorf(f.key.Line, fpath,
			"sliding_window counts periods of at most 53 days (its weighted count multiplies a period by 1000): use day, week or month, or fixed_window or sliding_log for a year")
		return false
	}
	c, err := calendar.Of(zone, l.Unit)
	if err != nil {
		p.errorf(f.val.Line, fpath, "%s is not an IANA time zone (e.g. UTC, Europe/Berlin, America/New_York)", quote(zone))
		return false
	}
	l.Calendar = c
	return true
}
