package calendar

import (
	"math/rand"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithms"
)

// at returns the instant of a local time in zone.
func at(t *testing.T, zone string, y int, m time.Month, d, h, min int) time.Time {
	t.Helper()
	loc, err := time.LoadLocation(zone)
	if err != nil {
		t.Fatal(err)
	}
	return time.Date(y, m, d, h, min, 0, 0, loc)
}

// TestPeriods: the windows of each unit around chosen instants, across a
// month's end, a leap February and the daylight-saving changes of two zones.
func TestPeriods(t *testing.T) {
	for _, c := range []struct {
		zone       string
		unit       algorithms.Unit
		now        time.Time
		prev       time.Time
		start, end time.Time
		next       time.Time
	}{
		// March 2026 in Berlin: the clocks go forward on the 29th, so March
		// is 31 days less an hour.
		{"Europe/Berlin", algorithms.UnitMonth, at(t, "Europe/Berlin", 2026, 3, 31, 23, 59),
			at(t, "Europe/Berlin", 2026, 2, 1, 0, 0), at(t, "Europe/Berlin", 2026, 3, 1, 0, 0),
			at(t, "Europe/Berlin", 2026, 4, 1, 0, 0), at(t, "Europe/Berlin", 2026, 5, 1, 0, 0)},
		// The day of the change has 23 hours, the one back in October 25.
		{"Europe/Berlin", algorithms.UnitDay, at(t, "Europe/Berlin", 2026, 3, 29, 12, 0),
			at(t, "Europe/Berlin", 2026, 3, 28, 0, 0), at(t, "Europe/Berlin", 2026, 3, 29, 0, 0),
			at(t, "Europe/Berlin", 2026, 3, 30, 0, 0), at(t, "Europe/Berlin", 2026, 3, 31, 0, 0)},
		{"Europe/Berlin", algorithms.UnitDay, at(t, "Europe/Berlin", 2026, 10, 25, 2, 30),
			at(t, "Europe/Berlin", 2026, 10, 24, 0, 0), at(t, "Europe/Berlin", 2026, 10, 25, 0, 0),
			at(t, "Europe/Berlin", 2026, 10, 26, 0, 0), at(t, "Europe/Berlin", 2026, 10, 27, 0, 0)},
		{"America/New_York", algorithms.UnitDay, at(t, "America/New_York", 2026, 11, 1, 23, 0),
			at(t, "America/New_York", 2026, 10, 31, 0, 0), at(t, "America/New_York", 2026, 11, 1, 0, 0),
			at(t, "America/New_York", 2026, 11, 2, 0, 0), at(t, "America/New_York", 2026, 11, 3, 0, 0)},
		// February 2028 has 29 days.
		{"UTC", algorithms.UnitMonth, time.Date(2028, 2, 29, 12, 0, 0, 0, time.UTC),
			time.Date(2028, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2028, 2, 1, 0, 0, 0, 0, time.UTC),
			time.Date(2028, 3, 1, 0, 0, 0, 0, time.UTC), time.Date(2028, 4, 1, 0, 0, 0, 0, time.UTC)},
		// ISO weeks start on Monday: Thursday January 1st, 2026 is in the
		// week of Monday December 29th.
		{"UTC", algorithms.UnitWeek, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
			time.Date(2025, 12, 22, 0, 0, 0, 0, time.UTC), time.Date(2025, 12, 29, 0, 0, 0, 0, time.UTC),
			time.Date(2026, 1, 5, 0, 0, 0, 0, time.UTC), time.Date(2026, 1, 12, 0, 0, 0, 0, time.UTC)},
		{"America/New_York", algorithms.UnitYear, at(t, "America/New_York", 2026, 12, 31, 23, 59),
			at(t, "America/New_York", 2025, 1, 1, 0, 0), at(t, "America/New_York", 2026, 1, 1, 0, 0),
			at(t, "America/New_York", 2027, 1, 1, 0, 0), at(t, "America/New_York", 2028, 1, 1, 0, 0)},
	} {
		cal, err := Of(c.zone, c.unit)
		if err != nil {
			t.Fatal(err)
		}
		p := cal.Periods(c.now.UnixNano())
		want := [4]int64{c.prev.UnixNano(), c.start.UnixNano(), c.end.UnixNano(), c.next.UnixNano()}
		if got := [4]int64{p.Prev, p.Start, p.End, p.Next}; got != want {
			t.Errorf("%v at %v:\n got %v\nwant %v", cal, c.now, got, want)
		}
	}
	mar, _ := Of("Europe/Berlin", algorithms.UnitMonth)
	p := mar.Periods(at(t, "Europe/Berlin", 2026, 3, 15, 0, 0).UnixNano())
	if got := time.Duration(p.End - p.Start); got != 31*24*time.Hour-time.Hour {
		t.Errorf("March 2026 in Berlin lasts %v, want 31 days less an hour", got)
	}
}

// TestBoundariesProperty: over random instants of forty years in several
// zones, the six boundaries increase, the third and fourth hold the
// instant, each starts at local midnight of the right date (or the first
// instant of it) and periods are as long as the calendar allows.
func TestBoundariesProperty(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	zones := []string{"UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata", "America/Sao_Paulo", "Pacific/Apia"}
	for _, zone := range zones {
		for _, unit := range []algorithms.Unit{algorithms.UnitDay, algorithms.UnitWeek, algorithms.UnitMonth, algorithms.UnitYear} {
			c, err := Of(zone, unit)
			if err != nil {
				t.Fatal(err)
			}
			for range 300 {
				now := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano() + rng.Int63n(int64(40*365*24*time.Hour))
				b := c.Boundaries(now)
				if !(b[2] <= now && now < b[3]) {
					t.Fatalf("%v at %v: %v does not hold it", c, time.Unix(0, now), b)
				}
				for i := 1; i < 6; i++ {
					l := time.Duration(b[i] - b[i-1])
					if l <= 0 || l > c.Longest() || (l < c.Shortest() && zone != "Pacific/Apia") {
						t.Fatalf("%v at %v: period %d lasts %v", c, time.Unix(0, now), i, l)
					}
					s := time.Unix(0, b[i]).In(c.loc)
					if zone == "UTC" && (s.Hour() != 0 || s.Minute() != 0) {
						t.Fatalf("%v: a period starts at %v", c, s)
					}
					if unit == algorithms.UnitWeek && s.Weekday() != time.Monday {
						t.Fatalf("%v: a week starts on %v", c, s)
					}
					if (unit == algorithms.UnitMonth || unit == algorithms.UnitYear) && s.Day() != 1 {
						t.Fatalf("%v: a period starts on %v", c, s)
					}
				}
			}
		}
	}
}

// TestOf: zones that are not IANA names, "Local" and "" are refused; the
// same zone and unit give the same calendar.
func TestOf(t *testing.T) {
	for _, z := range []string{"", "Local", "Mars/Olympus", "../../etc/passwd", "Europe/Berlin\x00"} {
		if _, err := Of(z, algorithms.UnitMonth); err == nil {
			t.Errorf("zone %q accepted", z)
		}
	}
	if _, err := Of("UTC", algorithms.UnitSecond); err == nil {
		t.Error("unit second accepted")
	}
	a, _ := Of("Europe/Berlin", algorithms.UnitMonth)
	b, _ := Of("Europe/Berlin", algorithms.UnitMonth)
	if a != b || a.String() != "month in Europe/Berlin" {
		t.Errorf("Of gave %p %v and %p %v", a, a, b, b)
	}
}

// TestBoundariesAllocs: within one period, Boundaries answers from memory.
func TestBoundariesAllocs(t *testing.T) {
	c, _ := Of("Europe/Berlin", algorithms.UnitDay)
	now := at(t, "Europe/Berlin", 2026, 6, 1, 10, 0).UnixNano()
	c.Boundaries(now)
	if n := testing.AllocsPerRun(100, func() { now++; c.Boundaries(now) }); n != 0 {
		t.Fatalf("%v allocations per call within a period", n)
	}
}
