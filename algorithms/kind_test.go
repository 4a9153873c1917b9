package algorithms

import "testing"

func TestKinds(t *testing.T) {
	for _, k := range Kinds() {
		got, ok := ParseKind(k.String())
		if !ok || got != k {
			t.Errorf("ParseKind(%q) = %v, %v; want %v", k.String(), got, ok, k)
		}
	}
	for _, name := range []string{"", "unknown", "Fixed_Window", "leaky_bucket"} {
		if k, ok := ParseKind(name); ok || k != KindUnknown {
			t.Errorf("ParseKind(%q) = %v, %v; want unknown, false", name, k, ok)
		}
	}
	if s := Kind(200).String(); s != "unknown" {
		t.Errorf("Kind(200) = %q", s)
	}
	for _, c := range []struct {
		k              Kind
		burst, windows bool
	}{
		{KindUnknown, false, false},
		{KindFixedWindow, false, true},
		{KindSlidingWindow, false, true},
		{KindSlidingLog, false, true},
		{KindTokenBucket, true, false},
		{KindGCRA, true, false},
		{KindReserve, true, false},
	} {
		if c.k.HasBurst() != c.burst || c.k.HasWindows() != c.windows {
			t.Errorf("%v: HasBurst %v, HasWindows %v; want %v, %v", c.k, c.k.HasBurst(), c.k.HasWindows(), c.burst, c.windows)
		}
	}
}

func TestUnits(t *testing.T) {
	for _, c := range []struct {
		u          Unit
		name, enum string
		d          int64 // seconds
		calendar   bool
	}{
		{UnitSecond, "second", "SECOND", 1, false},
		{UnitMinute, "minute", "MINUTE", 60, false},
		{UnitHour, "hour", "HOUR", 3600, false},
		{UnitDay, "day", "DAY", 24 * 3600, true},
		{UnitWeek, "week", "WEEK", 7 * 24 * 3600, true},
		{UnitMonth, "month", "MONTH", 30 * 24 * 3600, true},
		{UnitYear, "year", "YEAR", 365 * 24 * 3600, true},
		{UnitUnknown, "unknown", "UNKNOWN", 0, false},
		{Unit(-1), "unknown", "UNKNOWN", 0, false},
		{Unit(263), "unknown", "UNKNOWN", 0, false}, // 7 modulo 256: no wrapping onto WEEK
	} {
		if c.u.Name() != c.name || c.u.String() != c.enum || c.u.Seconds() != c.d || c.u.IsCalendar() != c.calendar {
			t.Errorf("Unit(%d): %q %q %v %v; want %q %q %v %v", c.u, c.u.Name(), c.u.String(), c.u.Seconds(), c.u.IsCalendar(),
				c.name, c.enum, c.d, c.calendar)
		}
		if c.d == 0 {
			continue
		}
		if u, ok := ParseUnit(c.name); !ok || u != c.u {
			t.Errorf("ParseUnit(%q) = %v, %v", c.name, u, ok)
		}
		if u := UnitOfSeconds(c.d); u != c.u {
			t.Errorf("UnitOfSeconds(%d) = %v; want %v", c.d, u, c.u)
		}
	}
	if u := UnitOfSeconds(90); u != UnitUnknown {
		t.Errorf("UnitOfSeconds(90) = %v", u)
	}
	if got := Units(); len(got) != 7 || got[0] != UnitSecond || got[6] != UnitYear {
		t.Errorf("Units() = %v", got)
	}
}
