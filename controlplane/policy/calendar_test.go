package policy

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/calendar"
)

// TestCalendarLimits: calendar parses into a shared calendar of the limit's
// unit and zone; the nominal window stays the unit's (envoyproxy/ratelimit's
// lengths), for bounds and reports.
func TestCalendarLimits(t *testing.T) {
	d := mustParse(t, `
domain: cal
descriptors:
  - key: k
    rate_limits:
      - {unit: month, calendar: Europe/Berlin, requests_per_unit: 10}
      - {algorithm: sliding_window, unit: month, calendar: America/New_York, requests_per_unit: 10}
      - {algorithm: sliding_log, unit: year, calendar: UTC, requests_per_unit: 10}
      - {unit: month, requests_per_unit: 10}
`)
	ls := d.Limits()
	berlin, _ := calendar.Of("Europe/Berlin", algorithms.UnitMonth)
	if ls[0].Calendar != berlin || ls[0].Unit != algorithms.UnitMonth || ls[0].Window != 30*24*time.Hour {
		t.Errorf("limit 0: %+v", ls[0])
	}
	if ls[1].Calendar == nil || ls[1].Calendar.Zone() != "America/New_York" || ls[2].Calendar.Unit() != algorithms.UnitYear {
		t.Errorf("limits 1, 2: %v %v", ls[1].Calendar, ls[2].Calendar)
	}
	if ls[3].Calendar != nil {
		t.Errorf("a limit without calendar got %v", ls[3].Calendar)
	}
}

// TestCalendarErrors: a calendar that cannot apply is refused with its
// file, line and field, and the whole document with it.
func TestCalendarErrors(t *testing.T) {
	for _, c := range []struct{ body, want string }{
		{"      {unit: month, calendar: Mars/Olympus, requests_per_unit: 1}\n",
			`v.yaml:5: domain "api": descriptors[0].rate_limit.calendar: "Mars/Olympus" is not an IANA time zone (e.g. UTC, Europe/Berlin, America/New_York)`},
		{"      {unit: month, calendar: Local, requests_per_unit: 1}\n",
			`v.yaml:5: domain "api": descriptors[0].rate_limit.calendar: "Local" is not an IANA time zone`},
		{"      {window: 720h, calendar: UTC, requests_per_unit: 1}\n",
			`descriptors[0].rate_limit.calendar: counts whole calendar units: use unit (day, week, month or year) rather than window`},
		{"      {unit: day, unit_multiplier: 2, calendar: UTC, requests_per_unit: 1}\n",
			`descriptors[0].rate_limit.calendar: takes no unit_multiplier`},
		{"      {unit: hour, calendar: UTC, requests_per_unit: 1}\n",
			`descriptors[0].rate_limit.calendar: takes unit day, week, month or year (got hour`},
		{"      {algorithm: token_bucket, unit: month, calendar: UTC, requests_per_unit: 1}\n",
			`v.yaml:5: domain "api": descriptors[0].rate_limit.calendar: applies to the algorithms with windows (fixed_window, sliding_window, sliding_log); token_bucket refills`},
		{"      {algorithm: gcra, unit: day, calendar: UTC, requests_per_unit: 1}\n",
			`descriptors[0].rate_limit.calendar: applies to the algorithms with windows`},
		{"      {algorithm: reserve, max_wait: 1s, unit: day, calendar: UTC, requests_per_unit: 1}\n",
			`descriptors[0].rate_limit.calendar: applies to the algorithms with windows`},
		{"      {algorithm: sliding_window, unit: year, calendar: UTC, requests_per_unit: 1}\n",
			`descriptors[0].rate_limit.calendar: sliding_window counts periods of at most 53 days`},
		{"      {unlimited: true, calendar: UTC}\n",
			`descriptors[0].rate_limit.calendar: must not be set when unlimited is true`},
		{"      {unit: month, calendar: [UTC], requests_per_unit: 1}\n",
			`descriptors[0].rate_limit.calendar: must be a string, got a list`},
	} {
		_, err := Parse("v.yaml", []byte(limitDoc(c.body)))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q:\n got %v\nwant %s", c.body, err, c.want)
		}
	}
}

// TestUnitsKeepEnvoyproxyRatelimitLengths: without calendar, week, month
// and year are envoyproxy/ratelimit's fixed lengths from the Unix epoch: a
// week ends on Thursday 00:00 UTC (the epoch was a Thursday), a month
// lasts 30 days and starts on no particular date.
func TestUnitsKeepEnvoyproxyRatelimitLengths(t *testing.T) {
	for _, c := range []struct {
		unit algorithms.Unit
		d    time.Duration
	}{{algorithms.UnitWeek, 7 * 24 * time.Hour}, {algorithms.UnitMonth, 30 * 24 * time.Hour}, {algorithms.UnitYear, 365 * 24 * time.Hour}} {
		if unitLength(c.unit) != c.d {
			t.Errorf("%v lasts %v, want %v", c.unit, unitLength(c.unit), c.d)
		}
	}
	week := int64(unitLength(algorithms.UnitWeek))
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC) // a Wednesday
	end := time.Unix(0, (now.UnixNano()/week+1)*week).UTC()
	if end.Weekday() != time.Thursday || end.Hour() != 0 || end != time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC) {
		t.Errorf("a week window at %v ends %v, want Thursday 00:00 UTC", now, end)
	}
}
