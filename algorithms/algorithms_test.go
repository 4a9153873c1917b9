package algorithms

import (
	"errors"
	"testing"
)

const (
	ms  = int64(1e6)
	sec = int64(1e9)
)

// step is one call in a table test and what it must return.
type step struct {
	at, cost  int64
	allowed   bool
	remaining int64
	retry     int64
	reset     int64
}

// runSteps feeds steps to allow and checks every result.
func runSteps(t *testing.T, limit int64, allow func(now, cost int64) (Result, error), steps []step) {
	t.Helper()
	for i, s := range steps {
		r, err := allow(s.at, s.cost)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		want := Result{Allowed: s.allowed, Limit: limit, Remaining: s.remaining, RetryAfter: s.retry, ResetAfter: s.reset}
		r.Wait = 0
		if r != want {
			t.Fatalf("step %d (at %d cost %d):\n got %+v\nwant %+v", i, s.at, s.cost, r, want)
		}
	}
}

func TestFixedWindowAligned(t *testing.T) {
	l := FixedWindow{Limit: 3, Window: 10 * sec, Aligned: true}
	var s FixedWindowState
	runSteps(t, 3, func(now, cost int64) (Result, error) { return l.Allow(&s, now, cost) }, []step{
		{at: 12 * sec, cost: 1, allowed: true, remaining: 2, reset: 8 * sec},
		{at: 13 * sec, cost: 2, allowed: true, remaining: 0, reset: 7 * sec},
		{at: 19 * sec, cost: 1, allowed: false, remaining: 0, retry: 1 * sec, reset: 1 * sec},
		{at: 20 * sec, cost: 3, allowed: true, remaining: 0, reset: 10 * sec}, // new window
		{at: 29*sec + 999, cost: 0, allowed: true, remaining: 0, reset: sec - 999},
		{at: 45 * sec, cost: 0, allowed: true, remaining: 3, reset: 5 * sec}, // peek at an empty window: until it ends
		{at: 45 * sec, cost: 2, allowed: true, remaining: 1, reset: 5 * sec},
	})
}

func TestFixedWindowFirstHit(t *testing.T) {
	// INCR+EXPIRE: the window opens at the first hit.
	l := FixedWindow{Limit: 2, Window: 10 * sec}
	var s FixedWindowState
	runSteps(t, 2, func(now, cost int64) (Result, error) { return l.Allow(&s, now, cost) }, []step{
		{at: 12 * sec, cost: 1, allowed: true, remaining: 1, reset: 10 * sec},
		{at: 15 * sec, cost: 1, allowed: true, remaining: 0, reset: 7 * sec},
		{at: 21 * sec, cost: 1, allowed: false, remaining: 0, retry: 1 * sec, reset: 1 * sec},
		{at: 22 * sec, cost: 1, allowed: true, remaining: 1, reset: 10 * sec},
		{at: 40 * sec, cost: 2, allowed: true, remaining: 0, reset: 10 * sec},
	})
}

func TestFixedWindowNegativeTime(t *testing.T) {
	l := FixedWindow{Limit: 1, Window: 10, Aligned: true}
	var s FixedWindowState
	runSteps(t, 1, func(now, cost int64) (Result, error) { return l.Allow(&s, now, cost) }, []step{
		{at: -5, cost: 1, allowed: true, remaining: 0, reset: 5},
		{at: -1, cost: 1, allowed: false, remaining: 0, retry: 1, reset: 1},
		{at: 0, cost: 1, allowed: true, remaining: 0, reset: 10},
	})
}

func TestSlidingLog(t *testing.T) {
	l := SlidingLog{Limit: 3, Window: 10 * sec}
	s := l.NewState()
	runSteps(t, 3, func(now, cost int64) (Result, error) { return l.Allow(s, now, cost) }, []step{
		{at: 1 * sec, cost: 1, allowed: true, remaining: 2, reset: 10 * sec},
		{at: 4 * sec, cost: 1, allowed: true, remaining: 1, reset: 10 * sec},
		{at: 6 * sec, cost: 1, allowed: true, remaining: 0, reset: 10 * sec},
		{at: 8 * sec, cost: 1, allowed: false, remaining: 0, retry: 3 * sec, reset: 8 * sec},
		{at: 8 * sec, cost: 2, allowed: false, remaining: 0, retry: 6 * sec, reset: 8 * sec},
		{at: 11 * sec, cost: 1, allowed: true, remaining: 0, reset: 10 * sec}, // the 1s entry left at 11s
		{at: 16 * sec, cost: 2, allowed: true, remaining: 0, reset: 10 * sec}, // 4s and 6s left
		{at: 26 * sec, cost: 0, allowed: true, remaining: 3, reset: 0},
	})
}

func TestSlidingLogStateMismatch(t *testing.T) {
	small := SlidingLog{Limit: 2, Window: sec}.NewState()
	if _, err := (SlidingLog{Limit: 5, Window: sec}).Allow(small, 0, 1); err != ErrStateCapacity {
		t.Fatalf("err = %v, want ErrStateCapacity", err)
	}
	if _, err := (SlidingLog{Limit: 5, Window: sec}).Allow(&SlidingLogState{}, 0, 1); err != ErrStateCapacity {
		t.Fatalf("zero state: err = %v, want ErrStateCapacity", err)
	}
}

func TestSlidingWindow(t *testing.T) {
	l := SlidingWindow{Limit: 10, Window: 10 * sec}
	var s SlidingWindowState
	runSteps(t, 10, func(now, cost int64) (Result, error) { return l.Allow(&s, now, cost) }, []step{
		{at: 5 * sec, cost: 10, allowed: true, remaining: 0, reset: 15 * sec},
		// Next window: the 10 weigh < 0.9 only after 0.99s into it.
		{at: 9 * sec, cost: 1, allowed: false, remaining: 0, retry: 1990*ms + 1, reset: 11 * sec},
		// 12s: previous window weighs 0.8 -> estimate 8.
		{at: 12 * sec, cost: 2, allowed: true, remaining: 0, reset: 18 * sec},
		// 13s: weight 0.7 -> estimate 7+2 = 9: one more fits.
		// cost 2 fits once the weight is <= 0.6: 3.99s into the window.
		{at: 13 * sec, cost: 2, allowed: false, remaining: 1, retry: 990*ms + 1, reset: 17 * sec},
		{at: 13 * sec, cost: 1, allowed: true, remaining: 0, reset: 17 * sec},
		// 40s: both windows are long gone.
		{at: 40 * sec, cost: 0, allowed: true, remaining: 10, reset: 0},
	})
}

func TestSlidingWindowRetryInNextWindow(t *testing.T) {
	l := SlidingWindow{Limit: 4, Window: 1000}
	var s SlidingWindowState
	mustAllow(t, l, &s, 100, 4)
	// cur+cost > limit: it cannot fit in this window; in the next one the
	// previous 4 weigh (1000-e)/1000, so cost 2 fits once weight <= 0.5, at 500 into it.
	r, _ := l.Allow(&s, 200, 2)
	if r.Allowed || r.RetryAfter != 800+500 {
		t.Fatalf("got %+v, want denied with RetryAfter 1300", r)
	}
	r, _ = l.Allow(&s, 200+r.RetryAfter, 2)
	if !r.Allowed {
		t.Fatalf("retry at RetryAfter denied: %+v", r)
	}
}

func mustAllow(t *testing.T, l SlidingWindow, s *SlidingWindowState, now, cost int64) {
	t.Helper()
	if r, err := l.Allow(s, now, cost); err != nil || !r.Allowed {
		t.Fatalf("Allow(%d, %d) = %+v, %v", now, cost, r, err)
	}
}

func TestTokenBucketSeed(t *testing.T) {
	// Rate 20/s, burst 30, 50 calls at one instant: 30 allowed with remaining
	// 29..0, then 20 denied.
	l := TokenBucket{Rate: 20, Period: sec, Burst: 30}
	var s TokenBucketState
	now := int64(1_700_000_000) * sec
	for i := 0; i < 50; i++ {
		r, err := l.Allow(&s, now, 1)
		if err != nil {
			t.Fatal(err)
		}
		if i < 30 {
			if !r.Allowed || r.Remaining != int64(29-i) {
				t.Fatalf("call %d: %+v, want allowed with remaining %d", i, r, 29-i)
			}
			continue
		}
		if r.Allowed || r.Remaining != 0 || r.RetryAfter != 50*ms || r.ResetAfter != 1500*ms {
			t.Fatalf("call %d: %+v, want denied, retry 50ms, reset 1.5s", i, r)
		}
	}
}

func TestTokenBucketRefill(t *testing.T) {
	l := TokenBucket{Rate: 3, Period: sec, Burst: 2} // a token every 333.33ms
	var s TokenBucketState
	runSteps(t, 2, func(now, cost int64) (Result, error) { return l.Allow(&s, now, cost) }, []step{
		{at: 0, cost: 2, allowed: true, remaining: 0, reset: 666666667},
		{at: 100 * ms, cost: 1, allowed: false, remaining: 0, retry: 233333334, reset: 566666667},
		{at: 333333334, cost: 1, allowed: true, remaining: 0, reset: 666666666},
		{at: 10 * sec, cost: 0, allowed: true, remaining: 2, reset: 0},
	})
}

func TestGCRARedisCell(t *testing.T) {
	// redis-cell's own walk-through: max_burst 4, 1 per second.
	l := GCRA{MaxBurst: 4, Count: 1, Period: sec}
	var s GCRAState
	start := int64(1_700_000_000) * sec
	type c struct {
		at              int64
		cost, remaining int64
		reset, retry    int64
		limited         bool
	}
	for i, tc := range []c{
		{0, 1, 4, 1 * sec, 0, false},
		{0, 1, 3, 2 * sec, 0, false},
		{0, 1, 2, 3 * sec, 0, false},
		{0, 1, 1, 4 * sec, 0, false},
		{0, 1, 0, 5 * sec, 0, false},
		{0, 1, 0, 5 * sec, 1 * sec, true},
		{3000 * ms, 1, 2, 3000 * ms, 0, false},
		{3100 * ms, 1, 1, 3900 * ms, 0, false},
		{4000 * ms, 1, 1, 4000 * ms, 0, false},
		{8000 * ms, 1, 4, 1000 * ms, 0, false},
		{9500 * ms, 1, 4, 1000 * ms, 0, false},
		{9500 * ms, 0, 4, 1000 * ms, 0, false}, // quantity 0 peeks
		{9500 * ms, 2, 2, 3000 * ms, 0, false},
		{9500 * ms, 5, 2, 3000 * ms, 3000 * ms, true},
	} {
		r, err := l.Allow(&s, start+tc.at, tc.cost)
		if err != nil {
			t.Fatal(err)
		}
		if r.Allowed == tc.limited || r.Limit != 5 || r.Remaining != tc.remaining || r.ResetAfter != tc.reset || r.RetryAfter != tc.retry {
			t.Fatalf("case %d: got %+v, want limited=%v remaining=%d reset=%d retry=%d", i, r, tc.limited, tc.remaining, tc.reset, tc.retry)
		}
	}
	// The CL.THROTTLE reply of the last case.
	r, _ := l.Allow(&s, start+9600*ms, 5)
	if got, want := CellReply(r, sec), [5]int64{1, 5, 2, 3, 3}; got != want {
		t.Fatalf("CellReply = %v, want %v", got, want)
	}
	r, _ = l.Allow(&s, start+9600*ms, 1)
	if got, want := CellReply(r, sec), [5]int64{0, 5, 1, -1, 4}; got != want {
		t.Fatalf("CellReply = %v, want %v", got, want)
	}
}

func TestReserve(t *testing.T) {
	// 2 per second, burst 2, callers wait up to 1s.
	l := Reserve{Rate: 2, Period: sec, Burst: 2, MaxWait: sec}
	var s ReserveState
	type c struct {
		at, cost, wait int64
		allowed        bool
		retry          int64
	}
	for i, tc := range []c{
		{0, 2, 0, true, 0},         // stored permits
		{0, 1, 0, true, 0},         // pays later: proceeds now, next caller waits 500ms
		{0, 1, 500 * ms, true, 0},  // waits 500ms; next free at 1s
		{0, 1, 1000 * ms, true, 0}, // waits the full MaxWait; next free at 1.5s
		{0, 1, 1500 * ms, false, 500 * ms},
		{500 * ms, 1, 1000 * ms, true, 0}, // retried after RetryAfter: wait is MaxWait
		{10 * sec, 2, 0, true, 0},         // idle: the store refilled
	} {
		r, err := l.Allow(&s, tc.at, tc.cost)
		if err != nil {
			t.Fatal(err)
		}
		if r.Allowed != tc.allowed || r.Wait != tc.wait || r.RetryAfter != tc.retry {
			t.Fatalf("case %d: got %+v, want allowed=%v wait=%d retry=%d", i, r, tc.allowed, tc.wait, tc.retry)
		}
	}
}

func TestInvalidLimits(t *testing.T) {
	var (
		fw FixedWindowState
		sw SlidingWindowState
		tb TokenBucketState
		g  GCRAState
		rs ReserveState
	)
	for _, tc := range []struct {
		name string
		call func() (Result, error)
		want error
	}{
		{"fixed zero limit", func() (Result, error) { return FixedWindow{Limit: 0, Window: 1}.Allow(&fw, 0, 1) }, ErrLimit},
		{"fixed negative window", func() (Result, error) { return FixedWindow{Limit: 1, Window: -1}.Allow(&fw, 0, 1) }, ErrWindow},
		{"fixed huge window", func() (Result, error) { return FixedWindow{Limit: 1, Window: 1 << 62}.Allow(&fw, 0, 1) }, ErrWindowTooLong},
		{"fixed negative cost", func() (Result, error) { return FixedWindow{Limit: 1, Window: 1}.Allow(&fw, 0, -1) }, ErrCostNegative},
		{"fixed cost over limit", func() (Result, error) { return FixedWindow{Limit: 1, Window: 1}.Allow(&fw, 0, 2) }, ErrCostTooLarge},
		{"log zero window", func() (Result, error) { return SlidingLog{Limit: 1}.Allow(&SlidingLogState{}, 0, 1) }, ErrWindow},
		{"log cost over limit", func() (Result, error) {
			l := SlidingLog{Limit: 2, Window: 5}
			return l.Allow(l.NewState(), 0, 3)
		}, ErrCostTooLarge},
		{"sliding negative limit", func() (Result, error) { return SlidingWindow{Limit: -3, Window: 5}.Allow(&sw, 0, 1) }, ErrLimit},
		{"sliding huge limit", func() (Result, error) { return SlidingWindow{Limit: 1 << 60, Window: 5}.Allow(&sw, 0, 1) }, ErrLimitTooLarge},
		{"sliding huge window", func() (Result, error) { return SlidingWindow{Limit: 1, Window: 1 << 60}.Allow(&sw, 0, 1) }, ErrWindowTooLong},
		{"bucket zero rate", func() (Result, error) { return TokenBucket{Rate: 0, Period: 1, Burst: 1}.Allow(&tb, 0, 1) }, ErrRate},
		{"bucket zero period", func() (Result, error) { return TokenBucket{Rate: 1, Period: 0, Burst: 1}.Allow(&tb, 0, 1) }, ErrPeriod},
		{"bucket zero burst", func() (Result, error) { return TokenBucket{Rate: 1, Period: 1, Burst: 0}.Allow(&tb, 0, 1) }, ErrBurst},
		{"bucket overflow", func() (Result, error) { return TokenBucket{Rate: 1, Period: 1 << 40, Burst: 1 << 30}.Allow(&tb, 0, 1) }, ErrPeriodTooLong},
		{"bucket cost over burst", func() (Result, error) { return TokenBucket{Rate: 1, Period: 1, Burst: 3}.Allow(&tb, 0, 4) }, ErrCostTooLarge},
		{"gcra negative burst", func() (Result, error) { return GCRA{MaxBurst: -1, Count: 1, Period: 1}.Allow(&g, 0, 1) }, ErrMaxBurst},
		{"gcra zero count", func() (Result, error) { return GCRA{MaxBurst: 1, Count: 0, Period: 1}.Allow(&g, 0, 1) }, ErrCount},
		{"gcra zero interval", func() (Result, error) { return GCRA{MaxBurst: 1, Count: 10, Period: 5}.Allow(&g, 0, 1) }, ErrCountTooHigh},
		{"gcra cost over limit", func() (Result, error) { return GCRA{MaxBurst: 1, Count: 1, Period: 5}.Allow(&g, 0, 3) }, ErrCostTooLarge},
		{"reserve negative wait", func() (Result, error) { return Reserve{Rate: 1, Period: 1, Burst: 1, MaxWait: -1}.Allow(&rs, 0, 1) }, ErrMaxWait},
		{"reserve cost over burst", func() (Result, error) { return Reserve{Rate: 1, Period: 1, Burst: 1}.Allow(&rs, 0, 2) }, ErrCostTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := tc.call()
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if r.Allowed {
				t.Fatal("an invalid call was allowed")
			}
			var le *LimitError
			if !errors.As(err, &le) || le.Field == "" {
				t.Fatalf("error %v does not name a field", err)
			}
		})
	}
	if fw != (FixedWindowState{}) || sw != (SlidingWindowState{}) || tb != (TokenBucketState{}) || g != (GCRAState{}) || rs != (ReserveState{}) {
		t.Fatal("an invalid call changed state")
	}
}

// TestLoweredLimit: state left by a higher limit never yields a negative
// Remaining once the limit is lowered.
func TestLoweredLimit(t *testing.T) {
	var tb TokenBucketState
	TokenBucket{Rate: 1, Period: sec, Burst: 100}.Allow(&tb, 0, 100)
	if r, _ := (TokenBucket{Rate: 1, Period: sec, Burst: 10}).Allow(&tb, 0, 1); r.Allowed || r.Remaining != 0 {
		t.Fatalf("token bucket: %+v", r)
	}
	var rs ReserveState
	Reserve{Rate: 1, Period: sec, Burst: 100}.Allow(&rs, 0, 100)
	if r, _ := (Reserve{Rate: 1, Period: sec, Burst: 10, MaxWait: sec}).Allow(&rs, 0, 0); r.Remaining != 0 {
		t.Fatalf("reserve: %+v", r)
	}
	var fw FixedWindowState
	FixedWindow{Limit: 100, Window: sec}.Allow(&fw, 0, 100)
	if r, _ := (FixedWindow{Limit: 10, Window: sec}).Allow(&fw, 0, 0); r.Remaining != 0 {
		t.Fatalf("fixed window: %+v", r)
	}
}
