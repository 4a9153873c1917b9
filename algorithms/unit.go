package algorithms

import "time"

// Unit is a rate-limit unit, numbered as RLS v3 numbers them
// (envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit, where WEEK
// came after YEAR), so that a conversion to that enum is the unit. It is an
// int32, as protobuf enums are: a value decoded from the wire that is out
// of range stays unknown rather than wrapping onto a unit.
type Unit int32

// The units. UnitUnknown is reported for windows that are not one whole
// unit.
const (
	UnitUnknown Unit = 0
	UnitSecond  Unit = 1
	UnitMinute  Unit = 2
	UnitHour    Unit = 3
	UnitDay     Unit = 4
	UnitMonth   Unit = 5
	UnitYear    Unit = 6
	UnitWeek    Unit = 7
)

// unitInfo is each unit's names and length, shortest first. Lengths are
// envoyproxy/ratelimit's: a month is 30 days and a year 365 days (a
// calendar counts real ones).
var unitInfo = [...]struct {
	unit       Unit
	name, enum string
	d          time.Duration
}{
	{UnitSecond, "second", "SECOND", time.Second},
	{UnitMinute, "minute", "MINUTE", time.Minute},
	{UnitHour, "hour", "HOUR", time.Hour},
	{UnitDay, "day", "DAY", 24 * time.Hour},
	{UnitWeek, "week", "WEEK", 7 * 24 * time.Hour},
	{UnitMonth, "month", "MONTH", 30 * 24 * time.Hour},
	{UnitYear, "year", "YEAR", 365 * 24 * time.Hour},
}

// Units returns every unit, shortest first.
func Units() []Unit {
	us := make([]Unit, len(unitInfo))
	for i, u := range unitInfo {
		us[i] = u.unit
	}
	return us
}

// String returns the RLS enum name, e.g. "MINUTE", or "UNKNOWN".
func (u Unit) String() string {
	for _, i := range unitInfo {
		if i.unit == u {
			return i.enum
		}
	}
	return "UNKNOWN"
}

// Name returns the unit's name as policies write it, e.g. "minute", or
// "unknown".
func (u Unit) Name() string {
	for _, i := range unitInfo {
		if i.unit == u {
			return i.name
		}
	}
	return "unknown"
}

// Duration returns the unit's length, or 0 for UnitUnknown.
func (u Unit) Duration() time.Duration {
	for _, i := range unitInfo {
		if i.unit == u {
			return i.d
		}
	}
	return 0
}

// ParseUnit returns the unit a policy names ("minute"), and whether there
// is one.
func ParseUnit(name string) (Unit, bool) {
	for _, i := range unitInfo {
		if i.name == name {
			return i.unit, true
		}
	}
	return UnitUnknown, false
}

// UnitOf returns the unit whose length is exactly d, or UnitUnknown.
func UnitOf(d time.Duration) Unit {
	for _, i := range unitInfo {
		if i.d == d {
			return i.unit
		}
	}
	return UnitUnknown
}

// IsCalendar reports whether u can count calendar periods: days, weeks,
// months and years, whose lengths differ in a time zone (Periods).
func (u Unit) IsCalendar() bool {
	return u == UnitDay || u == UnitWeek || u == UnitMonth || u == UnitYear
}
