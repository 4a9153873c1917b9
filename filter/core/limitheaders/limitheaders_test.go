package limitheaders

import (
	"testing"
	"time"
)

func TestFields(t *testing.T) {
	ps := []Policy{
		{Name: "per-ip", Quota: 100, Window: int64(time.Minute), Remaining: 0, Reset: int64(29*time.Second + 1)},
		{Name: `we"ird\név`, Quota: 5000, Window: int64(500 * time.Millisecond), Remaining: 4200, Reset: 0},
	}
	if got, want := string(AppendPolicy(nil, ps)), `"per-ip";q=100;w=60, "we\"ird\\n__v";q=5000;w=1`; got != want {
		t.Errorf("RateLimit-Policy = %s, want %s", got, want)
	}
	if got, want := string(AppendRateLimit(nil, ps)), `"per-ip";r=0;t=30, "we\"ird\\n__v";r=4200;t=0`; got != want {
		t.Errorf("RateLimit = %s, want %s", got, want)
	}
	if got := string(AppendPolicy([]byte("x"), nil)); got != "x" {
		t.Errorf("empty list wrote %q", got)
	}
}

func TestSecondsAndRetryAfter(t *testing.T) {
	for _, tt := range []struct {
		ns           int64
		secs, retry  string
		secondsValue int64
	}{
		{0, "0", "1", 0},
		{-5, "0", "1", 0},
		{1, "1", "1", 1},
		{int64(time.Second), "1", "1", 1},
		{int64(time.Second) + 1, "2", "2", 2},
		{int64(90 * time.Second), "90", "90", 90},
	} {
		if got := string(AppendSeconds(nil, tt.ns)); got != tt.secs {
			t.Errorf("AppendSeconds(%d) = %s, want %s", tt.ns, got, tt.secs)
		}
		if got := string(AppendRetryAfter(nil, tt.ns)); got != tt.retry {
			t.Errorf("AppendRetryAfter(%d) = %s, want %s", tt.ns, got, tt.retry)
		}
		if got := Seconds(tt.ns); got != tt.secondsValue {
			t.Errorf("Seconds(%d) = %d", tt.ns, got)
		}
	}
	if got := string(AppendInt(nil, -3)); got != "0" {
		t.Errorf("AppendInt(-3) = %s", got)
	}
}

func TestMostRestrictive(t *testing.T) {
	ps := []Policy{
		{Name: "a", Remaining: 5, Reset: 10},
		{Name: "b", Remaining: 2, Reset: 10},
		{Name: "c", Remaining: 2, Reset: 20},
		{Name: "d", Remaining: 3, Reset: 30},
	}
	if got := MostRestrictive(ps); got != 2 {
		t.Fatalf("MostRestrictive = %d, want 2", got)
	}
	if got := MostRestrictive(nil); got != -1 {
		t.Fatalf("MostRestrictive(nil) = %d", got)
	}
}

func TestAppendAllocatesNothing(t *testing.T) {
	ps := []Policy{{Name: "per-ip", Quota: 100, Window: int64(time.Minute), Reset: int64(time.Second)}}
	buf := make([]byte, 0, 256)
	if n := testing.AllocsPerRun(100, func() {
		buf = AppendPolicy(buf[:0], ps)
		buf = AppendRateLimit(buf, ps)
		buf = AppendRetryAfter(buf, 5)
	}); n != 0 {
		t.Fatalf("allocates %v times", n)
	}
}

func TestIsLimitHeader(t *testing.T) {
	for _, tt := range []struct {
		name string
		want bool
	}{
		{"RateLimit-Policy", true}, {"ratelimit", true}, {"RATELIMIT", true}, {"Retry-After", true},
		{"X-RateLimit-Limit", true}, {"x-ratelimit-remaining", true}, {"X-RateLimit-Reset", true},
		{"ratelimit-policies", false}, {"x-ratelimit", false}, {"", false}, {"x-custom", false},
	} {
		if got := IsLimitHeader(tt.name); got != tt.want {
			t.Errorf("IsLimitHeader(%q) = %v, want %v", tt.name, got, tt.want)
		}
	}
}
