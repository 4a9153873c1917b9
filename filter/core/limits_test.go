package core

import (
	"math"
	"testing"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/filter/core/precheck"
	"github.com/sluicehq/sluice/filter/core/rlsproto"
)

func TestDescriptorLimit(t *testing.T) {
	const ms = int64(1e6)
	meta := func(infos ...rlsproto.LimitInfo) *rlsproto.Response {
		return &rlsproto.Response{HasLimits: true, Limits: infos, Statuses: make([]rlsproto.Status, len(infos))}
	}
	tests := []struct {
		name  string
		resp  *rlsproto.Response
		i     int
		want  precheck.Limit
		ok    bool
		retry int64
	}{
		{"each algorithm", meta(rlsproto.LimitInfo{Algorithm: "sliding_window", Limit: 10, WindowMs: 1000}), 0,
			precheck.Limit{Algorithm: algorithms.KindSlidingWindow, Limit: 10, Window: 1000 * ms}, true, 0},
		{"fractions round safely", meta(rlsproto.LimitInfo{Algorithm: "token_bucket", Limit: 2.5, WindowMs: 1.0000009, Burst: 3.2, RetryAfterMs: 7.9999999}), 0,
			precheck.Limit{Algorithm: algorithms.KindTokenBucket, Limit: 3, Window: ms, Burst: 4}, true, 7999999},
		{"gcra", meta(rlsproto.LimitInfo{Algorithm: "gcra", Limit: 5, WindowMs: 60000, Burst: 1}), 0,
			precheck.Limit{Algorithm: algorithms.KindGCRA, Limit: 5, Window: 60000 * ms, Burst: 1}, true, 0},
		{"reserve", meta(rlsproto.LimitInfo{Algorithm: "reserve", Limit: 5, WindowMs: 1000, Burst: 2, RetryAfterMs: 3}), 0,
			precheck.Limit{Algorithm: algorithms.KindReserve, Limit: 5, Window: 1000 * ms, Burst: 2}, true, 3 * ms},
		{"fixed and log", meta(rlsproto.LimitInfo{Algorithm: "fixed_window", Limit: 1, WindowMs: 1}, rlsproto.LimitInfo{Algorithm: "sliding_log", Limit: 2, WindowMs: 2}), 1,
			precheck.Limit{Algorithm: algorithms.KindSlidingLog, Limit: 2, Window: 2 * ms}, true, 0},
		{"unknown algorithm", meta(rlsproto.LimitInfo{Algorithm: "leaky", Limit: 5, WindowMs: 1000}), 0, precheck.Limit{}, false, 0},
		{"empty element", meta(rlsproto.LimitInfo{}), 0, precheck.Limit{}, false, 0},
		{"NaN limit", meta(rlsproto.LimitInfo{Algorithm: "gcra", Limit: math.NaN(), WindowMs: 1000}), 0, precheck.Limit{}, false, 0},
		{"negative window", meta(rlsproto.LimitInfo{Algorithm: "gcra", Limit: 1, WindowMs: -1, RetryAfterMs: -5}), 0, precheck.Limit{}, false, 0},
		{"huge limit", meta(rlsproto.LimitInfo{Algorithm: "gcra", Limit: 1e300, WindowMs: 1}), 0, precheck.Limit{}, false, 0},
		{"huge retry", meta(rlsproto.LimitInfo{Algorithm: "gcra", Limit: 1, WindowMs: 1, RetryAfterMs: 1e300}), 0,
			precheck.Limit{Algorithm: algorithms.KindGCRA, Limit: 1, Window: ms}, true, 0},
		{"index beyond the metadata", meta(), 0, precheck.Limit{}, false, 0},
		{"current_limit fallback", &rlsproto.Response{Statuses: []rlsproto.Status{{HasLimit: true, RequestsPerUnit: 9, Unit: algorithms.UnitSecond, UnitMultiplier: 30, HasReset: true, DurationUntilReset: 5}}}, 0,
			precheck.Limit{Algorithm: algorithms.KindFixedWindow, Limit: 9, Window: 30e9}, true, 5},
		{"no current_limit", &rlsproto.Response{Statuses: []rlsproto.Status{{}}}, 0, precheck.Limit{}, false, 0},
		{"unknown unit", &rlsproto.Response{Statuses: []rlsproto.Status{{HasLimit: true, RequestsPerUnit: 9, Unit: 42}}}, 0, precheck.Limit{}, false, 0},
		{"index beyond the statuses", &rlsproto.Response{}, 0, precheck.Limit{}, false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := descriptorLimit(tt.resp, tt.i)
			if ok != tt.ok || got != tt.want {
				t.Fatalf("descriptorLimit = %+v, %v; want %+v, %v", got, ok, tt.want, tt.ok)
			}
			if r := descriptorRetryAfter(tt.resp, tt.i); r != tt.retry {
				t.Fatalf("descriptorRetryAfter = %d, want %d", r, tt.retry)
			}
		})
	}
}
