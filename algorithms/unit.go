package algorithms

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

// unitInfo is each unit's names and length in seconds, shortest first.
// Lengths are envoyproxy/ratelimit's: a month is 30 days and a year 365
// days (a calendar counts real ones). Seconds, not time.Duration: the
// package imports nothing, so that filter.wasm pays for no more of Go's
// runtime (package time brings syscall and its WASI imports).
var unitInfo = [...]struct {
	unit       Unit
	name, enum string
	seconds    int64
}{
	{UnitSecond, "second", "SECOND", 1},
	{UnitMinute, "minute", "MINUTE", 60},
	{UnitHour, "hour", "HOUR", 3600},
	{UnitDay, "day", "DAY", 86400},
	{UnitWeek, "week", "WEEK", 7 * 86400},
	{UnitMonth, "month", "MONTH", 30 * 86400},
	{UnitYear, "year", "YEAR", 365 * 86400},
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

// Seconds returns the unit's length in seconds, or 0 for UnitUnknown.
func (u Unit) Seconds() int64 {
	for _, i := range unitInfo {
		if i.unit == u {
			return i.seconds
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

// UnitOfSeconds returns the unit whose length is exactly s seconds, or
// UnitUnknown.
func UnitOfSeconds(s int64) Unit {
	for _, i := range unitInfo {
		if i.seconds == s {
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
