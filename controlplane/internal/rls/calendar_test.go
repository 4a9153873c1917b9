package rls

import (
	"context"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/calendar"
	"github.com/sluicehq/sluice/controlplane/policy"
	"github.com/sluicehq/sluice/controlplane/store/memory"
)

// calendarPolicy: a budget per calendar month in Berlin, one per calendar
// day in New York.
const calendarPolicy = `
domain: llm
response_headers: true
descriptors:
  - key: month
    rate_limit: {name: monthly, unit: month, calendar: Europe/Berlin, requests_per_unit: 3}
  - key: day
    rate_limit: {name: daily, algorithm: sliding_log, unit: day, calendar: America/New_York, requests_per_unit: 2}
`

// TestCalendarAnswers: duration_until_reset, the RateLimit header's t and
// Retry-After tell the truth at a month's end (in Berlin, two days after
// its clocks went forward) and across New York's daylight-saving change,
// on the memory store and on Redis; RateLimit-Policy names no window
// length, and the metadata sizes the filter's precheck from the shortest
// period.
func TestCalendarAnswers(t *testing.T) {
	berlin, _ := time.LoadLocation("Europe/Berlin")
	ny, _ := time.LoadLocation("America/New_York")
	for _, stName := range []string{"memory", "redis"} {
		t.Run(stName, func(t *testing.T) {
			c := &clock{}
			c.ns.Store(time.Date(2026, 3, 31, 23, 0, 0, 0, berlin).UnixNano())
			st, _ := settleStores[stName](t, c)
			svc, err := New(st, parse(t, calendarPolicy), Options{Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			call := func(k string) (*rlsResult, error) {
				r, err := svc.ShouldRateLimit(context.Background(), req("llm", desc(k)))
				if err != nil {
					return nil, err
				}
				return &rlsResult{r}, nil
			}
			for i := range 3 {
				r, err := call("month=a")
				if err != nil || r.code() != ok || r.reset() != time.Hour {
					t.Fatalf("request %d on March 31st at 23:00 in Berlin: %v %v, want OK, reset in 1h", i, r, err)
				}
			}
			r, err := call("month=a")
			if err != nil || r.code() != over || r.reset() != time.Hour || headerValue(r.r, HeaderRetryAfter) != "3600" {
				t.Fatalf("fourth request: %v %v, want OVER_LIMIT until April 1st (3600 s)", r, err)
			}
			if h := headerValue(r.r, HeaderPolicy); h != `"monthly";q=3` {
				t.Errorf("RateLimit-Policy %q: a calendar month has no one length", h)
			}
			c.Advance(time.Hour) // April 1st, midnight in Berlin: 30 days to May
			if r, err := call("month=a"); err != nil || r.code() != ok || r.r.Statuses[0].LimitRemaining != 2 || r.reset() != 30*24*time.Hour {
				t.Fatalf("April 1st: %v %v, want OK, 2 left, reset in 30 days", r, err)
			}
			if got := headerValue(r.r, HeaderRateLimit); got != `"monthly";r=0;t=3600` {
				t.Errorf("RateLimit before the month's end: %q", got)
			}
			// New York on the night its clocks go back: November 1st has
			// 25 hours; a request at 00:30 leaves the log at 00:30 on
			// November 2nd, 25 hours later.
			c.ns.Store(time.Date(2026, 11, 1, 0, 30, 0, 0, ny).UnixNano())
			for range 2 {
				call("day=b")
			}
			r, err = call("day=b")
			if err != nil || r.code() != over || r.reset() != 25*time.Hour {
				t.Fatalf("third request on November 1st in New York: %v %v, want OVER_LIMIT for 25h", r, err)
			}
		})
	}
	cal, _ := calendar.Of("Europe/Berlin", algorithms.UnitMonth)
	svc, _ := New(memory.New(memory.Options{}), parse(t, calendarPolicy), Options{Logger: quiet})
	r, _ := svc.ShouldRateLimit(context.Background(), req("llm", desc("month=a")))
	if ms := r.DynamicMetadata.Fields[MetadataKey].GetListValue().Values[0].GetStructValue().Fields[MetaWindowMs].GetNumberValue(); ms != float64(cal.Shortest().Milliseconds()) {
		t.Errorf("metadata window_ms %v, want the shortest month (%v)", ms, cal.Shortest())
	}
}

// rlsResult reads a one-descriptor answer.
type rlsResult struct{ r *rlsv3.RateLimitResponse }

func (x *rlsResult) code() rlsv3.RateLimitResponse_Code { return x.r.Statuses[0].Code }
func (x *rlsResult) reset() time.Duration               { return x.r.Statuses[0].DurationUntilReset.AsDuration() }
func (x *rlsResult) String() string                     { return x.r.String() }

// monthsPolicy: one-month limits with and without a calendar of their own,
// a two-month window, and a token bucket refilled per month.
const monthsPolicy = `
domain: m
descriptors:
  - key: fixed
    rate_limit: {unit: month, requests_per_unit: 2}
  - key: sliding
    rate_limit: {algorithm: sliding_log, unit: month, requests_per_unit: 2}
  - key: berlin
    rate_limit: {unit: month, calendar: Europe/Berlin, requests_per_unit: 2}
  - key: two
    rate_limit: {unit: month, unit_multiplier: 2, requests_per_unit: 2}
  - key: bucket
    rate_limit: {algorithm: token_bucket, unit: month, requests_per_unit: 2}
  - key: day
    rate_limit: {unit: day, requests_per_unit: 2}
`

// TestCalendarMonths: with Options.CalendarMonths (envoyproxy/ratelimit's
// USE_CALENDAR_MONTH_RATE_LIMIT) a one-month limit with windows and no
// calendar of its own counts UTC calendar months, as does a request's
// override of unit MONTH; the others keep their windows. Without it, a
// month is 30 days from the epoch.
func TestCalendarMonths(t *testing.T) {
	utc, err := calendar.Of("UTC", algorithms.UnitMonth)
	if err != nil {
		t.Fatal(err)
	}
	berlin, _ := calendar.Of("Europe/Berlin", algorithms.UnitMonth)
	set := parse(t, monthsPolicy)
	for _, tc := range []struct {
		months *calendar.Calendar
		want   map[string]*calendar.Calendar // by descriptor key
	}{
		{utc, map[string]*calendar.Calendar{"fixed": utc, "sliding": utc, "berlin": berlin, "two": nil, "bucket": nil, "day": nil}},
		{nil, map[string]*calendar.Calendar{"fixed": nil, "sliding": nil, "berlin": berlin, "two": nil, "bucket": nil, "day": nil}},
	} {
		v := newVersion(set, nil, tc.months)
		for key, want := range tc.want {
			l := set.Domain("m").Match([]policy.Entry{{Key: key, Value: "x"}})[0]
			if got := v.infoOf(l).store.Calendar; got != want {
				t.Errorf("months %v, %s: calendar %v, want %v", tc.months, key, got, want)
			}
		}
		override := &policy.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 5, Window: 30 * 24 * time.Hour, Unit: algorithms.UnitMonth}
		if got := v.infoOf(override).store.Calendar; got != tc.months {
			t.Errorf("months %v, an override of unit MONTH: calendar %v", tc.months, got)
		}
	}

	// The answers: at 23:00 on January 31st (UTC), a fixed month ends in an
	// hour, not at the end of a 30-day window from the epoch.
	c := &clock{}
	c.ns.Store(time.Date(2027, 1, 31, 23, 0, 0, 0, time.UTC).UnixNano())
	svc, err := New(memory.New(memory.Options{Now: c.Now}), set, Options{Logger: quiet, CalendarMonths: utc})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		svc.ShouldRateLimit(context.Background(), req("m", desc("fixed=x")))
	}
	r, err := svc.ShouldRateLimit(context.Background(), req("m", desc("fixed=x")))
	if res := (&rlsResult{r}); err != nil || res.code() != over || res.reset() != time.Hour {
		t.Fatalf("third request on January 31st at 23:00: %v %v, want OVER_LIMIT until February 1st", r, err)
	}
	c.Advance(time.Hour)
	if r, err := svc.ShouldRateLimit(context.Background(), req("m", desc("fixed=x"))); err != nil || (&rlsResult{r}).code() != ok {
		t.Fatalf("February 1st: %v %v, want OK", r, err)
	}
}
