package timerate

import (
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/sluicehq/sluice/algorithms"
)

// Both limiters: 100 per second, burst 100, one decision per iteration with
// the clock advancing 1µs a call (the same pattern as package algorithms'
// own benchmarks), so both mix admissions and denials in steady state.

func BenchmarkXTimeRateAllowN(b *testing.B) {
	l := rate.NewLimiter(100, 100)
	now := time.Unix(1_700_000_000, 0)
	for b.Loop() {
		now = now.Add(time.Microsecond)
		l.AllowN(now, 1)
	}
}

func BenchmarkSluiceTokenBucket(b *testing.B) {
	l := algorithms.TokenBucket{Rate: 100, Period: int64(time.Second), Burst: 100}
	var s algorithms.TokenBucketState
	now := int64(1_700_000_000) * int64(time.Second)
	for b.Loop() {
		now += int64(time.Microsecond)
		l.Allow(&s, now, 1)
	}
}
