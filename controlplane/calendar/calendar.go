// Package calendar computes the windows of limits that count by the
// calendar: days, ISO weeks (from Monday), months and years in a time zone,
// whose lengths differ (a day across a daylight-saving change has 23 or 25
// hours, a month 28 to 31 days). A limit with `calendar: Europe/Berlin` and
// `unit: month` counts from the first of each month, midnight in Berlin.
//
// The algorithms (package algorithms) take the windows as numbers, the
// Periods around now; a Calendar computes them, and remembers the last
// ones, so that a decision within the same window costs a comparison. The
// zone database is compiled into the binary (time/tzdata): the control
// plane's container image has none.
package calendar

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	_ "time/tzdata" // the zone database, for images without one

	"github.com/sluicehq/sluice/algorithms"
)

// Calendar is one unit in one time zone. It is safe for concurrent use.
// Calendars are shared: Of returns the same one for the same zone and unit,
// so that limits compare equal across policy reloads.
type Calendar struct {
	unit algorithms.Unit
	loc  *time.Location
	last atomic.Pointer[periods] // the periods last computed
}

// periods are six boundaries in a row and the Periods of the middle two.
type periods struct {
	b [6]int64
	p algorithms.Periods
}

// calendars holds every Calendar made, by zone and unit: a policy names a
// few zones, and a name that does not load is not kept.
var calendars = struct {
	sync.Mutex
	m map[key]*Calendar
}{m: map[key]*Calendar{}}

type key struct {
	zone string
	unit algorithms.Unit
}

// ErrZone is returned (wrapped) for a zone that is not an IANA time zone.
var ErrZone = errors.New("not an IANA time zone")

// Of returns the calendar of unit (day, week, month or year) in zone, an IANA time zone name such as
// "UTC" or "Europe/Berlin". "Local" and "" are refused: a limit must not
// depend on the host it runs on.
func Of(zone string, unit algorithms.Unit) (*Calendar, error) {
	if !unit.IsCalendar() {
		return nil, fmt.Errorf("calendar: unit %s is not day, week, month or year", unit.Name())
	}
	if zone == "" || zone == "Local" || len(zone) > 64 {
		return nil, fmt.Errorf("calendar: %q: %w (e.g. UTC, Europe/Berlin, America/New_York)", zone, ErrZone)
	}
	calendars.Lock()
	defer calendars.Unlock()
	if c := calendars.m[key{zone, unit}]; c != nil {
		return c, nil
	}
	loc, err := time.LoadLocation(zone)
	if err != nil {
		return nil, fmt.Errorf("calendar: %q: %w (e.g. UTC, Europe/Berlin, America/New_York)", zone, ErrZone)
	}
	c := &Calendar{unit: unit, loc: loc}
	calendars.m[key{zone, unit}] = c
	return c, nil
}

// Unit returns the calendar's unit.
func (c *Calendar) Unit() algorithms.Unit { return c.unit }

// Zone returns the calendar's time zone name.
func (c *Calendar) Zone() string { return c.loc.String() }

// Location returns the calendar's time zone.
func (c *Calendar) Location() *time.Location { return c.loc }

// String describes c, e.g. "month in Europe/Berlin".
func (c *Calendar) String() string { return c.unit.Name() + " in " + c.Zone() }

// Shortest returns a length no period of c is shorter than: the unit's
// shortest calendar length less the largest daylight-saving shift in use
// (two hours). It sizes what must never count less than c does.
func (c *Calendar) Shortest() time.Duration {
	const day = 24 * time.Hour
	switch c.unit {
	case algorithms.UnitWeek:
		return 7*day - 2*time.Hour
	case algorithms.UnitMonth:
		return 28*day - 2*time.Hour
	case algorithms.UnitYear:
		return 365*day - 2*time.Hour
	}
	return day - 2*time.Hour
}

// Longest returns a length no period of c is longer than.
func (c *Calendar) Longest() time.Duration {
	const day = 24 * time.Hour
	switch c.unit {
	case algorithms.UnitWeek:
		return 7*day + 2*time.Hour
	case algorithms.UnitMonth:
		return 31*day + 2*time.Hour
	case algorithms.UnitYear:
		return 366*day + 2*time.Hour
	}
	return day + 2*time.Hour
}

// Periods returns the periods around t (Unix nanoseconds): the one that
// holds t and its neighbours. They are shared: do not modify them.
func (c *Calendar) Periods(t int64) *algorithms.Periods {
	return &c.around(t).p
}

// Boundaries returns, in Unix nanoseconds, the starts of six periods in a
// row: the one that holds t is [b[2], b[3]). The Redis store sends them all
// so that its scripts find the periods around Redis's own clock, one
// period either side of this one. They are shared: do not modify them.
func (c *Calendar) Boundaries(t int64) *[6]int64 {
	return &c.around(t).b
}

// around returns the periods around t: the last ones computed while t is
// within them.
func (c *Calendar) around(t int64) *periods {
	if p := c.last.Load(); p != nil && p.b[2] <= t && t < p.b[3] {
		return p
	}
	b := c.compute(t)
	p := &periods{b: b, p: algorithms.Periods{Prev: b[1], Start: b[2], End: b[3], Next: b[4]}}
	c.last.Store(p)
	return p
}

// compute is Boundaries without the memory.
func (c *Calendar) compute(t int64) [6]int64 {
	local := time.Unix(0, t).In(c.loc)
	y, m, d := local.Date()
	switch c.unit {
	case algorithms.UnitWeek:
		d -= (int(local.Weekday()) + 6) % 7 // back to Monday
	case algorithms.UnitMonth:
		d = 1
	case algorithms.UnitYear:
		m, d = time.January, 1
	}
	y, m, d = c.step(y, m, d, 0)
	var b [6]int64
	b[2] = c.startOf(y, m, d)
	if b[2] > t { // a day whose midnight was skipped: the period began the day before
		b[2] = c.startOf(c.step(y, m, d, -1))
	}
	// Each neighbour is the start of the period one unit away, or further
	// where a zone skipped a whole period (a date that never began).
	for i, k := 3, 1; i < 6; i, k = i+1, k+1 {
		b[i] = c.startOf(c.step(y, m, d, k))
		for b[i] <= b[i-1] {
			k++
			b[i] = c.startOf(c.step(y, m, d, k))
		}
	}
	for i, k := 1, -1; i >= 0; i, k = i-1, k-1 {
		b[i] = c.startOf(c.step(y, m, d, k))
		for b[i] >= b[i+1] {
			k--
			b[i] = c.startOf(c.step(y, m, d, k))
		}
	}
	return b
}

// step returns the date k units after y-m-d (which starts a period),
// normalized (a day 0 is the last of the month before).
func (c *Calendar) step(y int, m time.Month, d, k int) (int, time.Month, int) {
	switch c.unit {
	case algorithms.UnitWeek:
		d += 7 * k
	case algorithms.UnitMonth:
		m += time.Month(k)
	case algorithms.UnitYear:
		y += k
	default:
		d += k
	}
	n := time.Date(y, m, d, 12, 0, 0, 0, time.UTC) // normalize the date only
	return n.Date()
}

// startOf returns when the date y-m-d begins in c's zone: its first
// instant, midnight, or the first time after it where a daylight-saving
// change skips midnight.
func (c *Calendar) startOf(y int, m time.Month, d int) int64 {
	s := time.Date(y, m, d, 0, 0, 0, 0, c.loc)
	// time.Date may answer an instant of the day before for a midnight
	// that does not exist; the day then begins when its date does.
	for i := 0; i < 24*4; i++ {
		if ly, lm, ld := s.In(c.loc).Date(); ly == y && lm == m && ld == d {
			break
		}
		s = s.Add(15 * time.Minute)
	}
	for i := 0; i < 24*4; i++ { // and never later than its first instant
		p := s.Add(-15 * time.Minute)
		if py, pm, pd := p.In(c.loc).Date(); py != y || pm != m || pd != d {
			break
		}
		s = p
	}
	return s.UnixNano()
}
