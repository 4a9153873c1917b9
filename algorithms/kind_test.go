package algorithms

import (
	"testing"
	"time"
)

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
		d          time.Duration
		calendar   bool
	}{
		{UnitSecond, "second", "SECOND", time.Second, false},
		{UnitMinute, "minute", "MINUTE", time.Minute, false},
		{UnitHour, "hour", "HOUR", time.Hour, false},
		{UnitDay, "day", "DAY", 24 * time.Hour, true},
		{UnitWeek, "week", "WEEK", 7 * 24 * time.Hour, true},
		{UnitMonth, "month", "MONTH", 30 * 24 * time.Hour, true},
		{UnitYear, "year", "YEAR", 365 * 24 * time.Hour, true},
		{UnitUnknown, "unknown", "UNKNOWN", 0, false},
		{Unit(-1), "unknown", "UNKNOWN", 0, false},
		{Unit(263), "unknown", "UNKNOWN", 0, false}, // 7 modulo 256: no wrapping onto WEEK
	} {
		if c.u.Name() != c.name || c.u.String() != c.enum || c.u.Duration() != c.d || c.u.IsCalendar() != c.calendar {
			t.Errorf("Unit(%d): %q %q %v %v; want %q %q %v %v", c.u, c.u.Name(), c.u.String(), c.u.Duration(), c.u.IsCalendar(),
				c.name, c.enum, c.d, c.calendar)
		}
		if c.d == 0 {
			continue
		}
		if u, ok := ParseUnit(c.name); !ok || u != c.u {
			t.Errorf("ParseUnit(%q) = %v, %v", c.name, u, ok)
		}
		if u := UnitOf(c.d); u != c.u {
			t.Errorf("UnitOf(%v) = %v; want %v", c.d, u, c.u)
		}
	}
	if u := UnitOf(90 * time.Second); u != UnitUnknown {
		t.Errorf("UnitOf(90s) = %v", u)
	}
	if got := Units(); len(got) != 7 || got[0] != UnitSecond || got[6] != UnitYear {
		t.Errorf("Units() = %v", got)
	}
}
