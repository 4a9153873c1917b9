package policy

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithms"
)

func TestParams(t *testing.T) {
	d := mustParseFile(t, "extensions.yaml")
	tests := []struct {
		id   string
		unit time.Duration
		want any
	}{
		{"user#0", time.Nanosecond, algorithms.TokenBucket{Rate: 10, Period: 1e9, Burst: 50}},
		{"user#0", time.Microsecond, algorithms.TokenBucket{Rate: 10, Period: 1e6, Burst: 50}},
		{"user#1", time.Microsecond, algorithms.SlidingWindow{Limit: 10000, Window: 86400e6}},
		{"user/path#0", time.Nanosecond, algorithms.GCRA{MaxBurst: 4, Count: 90, Period: 90e9}},
		{"batch#0", time.Microsecond, algorithms.GCRA{MaxBurst: 29, Count: 30, Period: 300e6}},
		{"login#0", time.Microsecond, algorithms.SlidingLog{Limit: 5, Window: 900e6}},
		{"legacy#0", time.Nanosecond, algorithms.FixedWindow{Limit: 7, Window: 60e9, Aligned: true}},
		{"tiny#0", time.Microsecond, algorithms.TokenBucket{Rate: 1, Period: 250e3, Burst: 1}},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s/%v", tt.id, tt.unit), func(t *testing.T) {
			l := limitByID(t, d, tt.id)
			if got := l.Params(tt.unit); got != tt.want {
				t.Errorf("Params = %#v, want %#v", got, tt.want)
			}
		})
	}
}

// TestParamsDecide runs the converted parameters through the algorithms: a
// 10-per-10s fixed window aligned to the clock admits 10 and refuses the
// 11th until the next window.
func TestParamsDecide(t *testing.T) {
	d := mustParseExample(t)
	l := d.Match(entries("remote_address=10.0.0.1"))[0]
	fw := l.FixedWindowParams(time.Nanosecond)
	var st algorithms.FixedWindowState
	now := int64(1_700_000_003 * time.Second) // 3s into an aligned 10s window
	for i := 0; i < 10; i++ {
		if r, err := fw.Allow(&st, now, 1); err != nil || !r.Allowed {
			t.Fatalf("request %d: %+v %v", i, r, err)
		}
	}
	r, err := fw.Allow(&st, now, 1)
	if err != nil || r.Allowed || r.RetryAfter != int64(7*time.Second) {
		t.Fatalf("11th: %+v %v (want denied, retry after 7s: windows are aligned)", r, err)
	}
}

// TestBoundsAccepted checks that limits right at each bound parse, and that
// everything Parse accepts validates in both time units.
func TestBoundsAccepted(t *testing.T) {
	for _, body := range []string{
		"algorithm: sliding_log\n      unit: second\n      requests_per_unit: 100000",
		"algorithm: gcra\n      unit: second\n      requests_per_unit: 1000000",
		"algorithm: sliding_window\n      window: 640h\n      requests_per_unit: 4294967295",
		"algorithm: token_bucket\n      unit: day\n      requests_per_unit: 5\n      burst: 26000",
		"algorithm: gcra\n      unit: day\n      requests_per_unit: 1\n      burst: 26000",
		"algorithm: gcra\n      unit: day\n      requests_per_unit: 1000\n      burst: 26000000",
		"window: 600000h\n      requests_per_unit: 1",
		"window: 1us\n      requests_per_unit: 4294967295",
	} {
		d, err := Parse("b.yaml", []byte(limitDoc("      "+body+"\n")))
		if err != nil {
			t.Errorf("%s: %v", body, err)
			continue
		}
		l := d.Limits()[0]
		for _, u := range []time.Duration{time.Nanosecond, time.Microsecond} {
			if err := l.validate(u); err != nil {
				t.Errorf("%s in %v: %v", body, u, err)
			}
		}
	}
}
