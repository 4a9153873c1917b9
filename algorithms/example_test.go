package algorithms_test

import (
	"fmt"

	"github.com/sluicehq/sluice/algorithms"
)

// A fixed window of 2 requests per 10 s, aligned to the clock, decided at
// seconds 1, 2, 3 and 11: the third waits for the next window.
func ExampleFixedWindow() {
	l := algorithms.FixedWindow{Limit: 2, Window: 10, Aligned: true} // times in seconds
	var s algorithms.FixedWindowState                                // the zero state: nothing counted yet
	for _, now := range []int64{1, 2, 3, 11} {
		r, err := l.Allow(&s, now, 1)
		if err != nil {
			panic(err)
		}
		fmt.Printf("t=%d allowed=%v remaining=%d retry after %d\n", now, r.Allowed, r.Remaining, r.RetryAfter)
	}
	// Output:
	// t=1 allowed=true remaining=1 retry after 0
	// t=2 allowed=true remaining=0 retry after 0
	// t=3 allowed=false remaining=0 retry after 7
	// t=11 allowed=true remaining=1 retry after 0
}

// A fixed window that counts calendar periods: the caller passes the
// periods around now (here February and its neighbours, in days).
func ExampleFixedWindow_periods() {
	feb := &algorithms.Periods{Prev: 0, Start: 31, End: 59, Next: 90} // January, February, March
	l := algorithms.FixedWindow{Limit: 1, Window: 31, Periods: feb}
	var s algorithms.FixedWindowState
	r, _ := l.Allow(&s, 40, 1)
	fmt.Println("day 40:", r.Allowed, "resets after", r.ResetAfter, "days")
	r, _ = l.Allow(&s, 41, 1)
	fmt.Println("day 41:", r.Allowed, "retry after", r.RetryAfter, "days")
	// Output:
	// day 40: true resets after 19 days
	// day 41: false retry after 18 days
}

// A token bucket of 3 tokens refilled at 1 per 100 ms, times in
// milliseconds: a burst of 3 passes, the fourth waits for a token.
func ExampleTokenBucket() {
	l := algorithms.TokenBucket{Rate: 1, Period: 100, Burst: 3}
	var s algorithms.TokenBucketState // the zero state is a full bucket
	for _, now := range []int64{0, 0, 0, 0, 150} {
		r, _ := l.Allow(&s, now, 1)
		fmt.Printf("t=%dms allowed=%v remaining=%d retry after %dms\n", now, r.Allowed, r.Remaining, r.RetryAfter)
	}
	// Output:
	// t=0ms allowed=true remaining=2 retry after 0ms
	// t=0ms allowed=true remaining=1 retry after 0ms
	// t=0ms allowed=true remaining=0 retry after 0ms
	// t=0ms allowed=false remaining=0 retry after 100ms
	// t=150ms allowed=true remaining=0 retry after 0ms
}

// A cost larger than a limiter can ever hold is an error, not a promise to
// retry: ErrCostTooLarge.
func ExampleTokenBucket_costTooLarge() {
	l := algorithms.TokenBucket{Rate: 1, Period: 100, Burst: 3}
	var s algorithms.TokenBucketState
	_, err := l.Allow(&s, 0, 4)
	fmt.Println(err)
	// Output:
	// algorithms: cost exceeds the limiter's capacity, so it could never be allowed
}

// The algorithm a policy names, and what it takes.
func ExampleParseKind() {
	for _, name := range []string{"token_bucket", "sliding_log", "leaky_bucket"} {
		k, ok := algorithms.ParseKind(name)
		fmt.Printf("%s: %v %v burst=%v windows=%v\n", name, k, ok, k.HasBurst(), k.HasWindows())
	}
	// Output:
	// token_bucket: token_bucket true burst=true windows=false
	// sliding_log: sliding_log true burst=false windows=true
	// leaky_bucket: unknown false burst=false windows=false
}

// A window's unit, as RLS reports it: one whole unit, or none.
func ExampleUnitOfSeconds() {
	for _, seconds := range []int64{60, 30 * 86400, 90} {
		u := algorithms.UnitOfSeconds(seconds)
		fmt.Printf("%ds: %s (%d), %q in a policy\n", seconds, u, u, u.Name())
	}
	// Output:
	// 60s: MINUTE (2), "minute" in a policy
	// 2592000s: MONTH (5), "month" in a policy
	// 90s: UNKNOWN (0), "unknown" in a policy
}

// Reserve tells the caller how long to wait instead of refusing, up to
// MaxWait: 1 permit per 100 ms, times in milliseconds. As in Guava's
// SmoothBursty, a request is served at once and the next one waits for
// what it took: the stored permit and one more pass at once.
func ExampleReserve() {
	l := algorithms.Reserve{Rate: 1, Period: 100, Burst: 1, MaxWait: 250}
	var s algorithms.ReserveState
	for range 5 {
		r, _ := l.Allow(&s, 0, 1)
		fmt.Printf("allowed=%v wait %dms\n", r.Allowed, r.Wait)
	}
	// Output:
	// allowed=true wait 0ms
	// allowed=true wait 0ms
	// allowed=true wait 100ms
	// allowed=true wait 200ms
	// allowed=false wait 300ms
}
