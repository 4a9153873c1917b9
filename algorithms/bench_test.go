package algorithms

import "testing"

// The benchmarks decide one request per iteration with the clock advancing
// 1µs a call, so each limiter mixes admissions and denials in steady state.

func BenchmarkFixedWindow(b *testing.B) {
	l := FixedWindow{Limit: 100, Window: 1e9, Aligned: true}
	var s FixedWindowState
	now := int64(1.7e18)
	for b.Loop() {
		now += 1000
		l.Allow(&s, now, 1)
	}
}

func BenchmarkSlidingLog(b *testing.B) {
	l := SlidingLog{Limit: 100, Window: 1e8}
	s := l.NewState()
	now := int64(1.7e18)
	for b.Loop() {
		now += 1000
		l.Allow(s, now, 1)
	}
}

func BenchmarkSlidingWindow(b *testing.B) {
	l := SlidingWindow{Limit: 100, Window: 1e9}
	var s SlidingWindowState
	now := int64(1.7e18)
	for b.Loop() {
		now += 1000
		l.Allow(&s, now, 1)
	}
}

func BenchmarkTokenBucket(b *testing.B) {
	l := TokenBucket{Rate: 100, Period: 1e9, Burst: 100}
	var s TokenBucketState
	now := int64(1.7e18)
	for b.Loop() {
		now += 1000
		l.Allow(&s, now, 1)
	}
}

func BenchmarkGCRA(b *testing.B) {
	l := GCRA{MaxBurst: 99, Count: 100, Period: 1e9}
	var s GCRAState
	now := int64(1.7e18)
	for b.Loop() {
		now += 1000
		l.Allow(&s, now, 1)
	}
}

func BenchmarkReserve(b *testing.B) {
	l := Reserve{Rate: 100, Period: 1e9, Burst: 100, MaxWait: 1e7}
	var s ReserveState
	now := int64(1.7e18)
	for b.Loop() {
		now += 1000
		l.Allow(&s, now, 1)
	}
}
