package policy

import (
	"time"

	"github.com/sluicehq/sluice/algorithms"
)

// The methods below give the parameters (package algorithms) a limit maps to,
// with times expressed in unit: time.Nanosecond for the Go algorithms (the
// memory store, the filter), time.Microsecond for the Redis Lua scripts.
// Parse guarantees that l.Window is a whole number of microseconds and that
// the parameters validate in both units (except for a limit of 0 requests,
// which refuses everything without counting: Params returns nil for it);
// other units truncate.
//
// Each method computes the parameters whatever l.Algorithm is; Params picks
// the one for l.Algorithm.

// FixedWindowParams returns l as a clock-aligned fixed window, the way
// envoyproxy/ratelimit counts.
func (l *Limit) FixedWindowParams(unit time.Duration) algorithms.FixedWindow {
	return algorithms.FixedWindow{Limit: l.Requests, Window: int64(l.Window / unit), Aligned: true}
}

// SlidingWindowParams returns l as a sliding window counter.
func (l *Limit) SlidingWindowParams(unit time.Duration) algorithms.SlidingWindow {
	return algorithms.SlidingWindow{Limit: l.Requests, Window: int64(l.Window / unit)}
}

// SlidingLogParams returns l as a sliding log.
func (l *Limit) SlidingLogParams(unit time.Duration) algorithms.SlidingLog {
	return algorithms.SlidingLog{Limit: l.Requests, Window: int64(l.Window / unit)}
}

// TokenBucketParams returns l as a token bucket: Burst tokens, refilled at
// Requests per Window.
func (l *Limit) TokenBucketParams(unit time.Duration) algorithms.TokenBucket {
	return algorithms.TokenBucket{Rate: l.Requests, Period: int64(l.Window / unit), Burst: l.burst()}
}

// GCRAParams returns l as redis-cell's CL.THROTTLE parameters: max_burst =
// Burst-1, count = Requests, period = Window.
func (l *Limit) GCRAParams(unit time.Duration) algorithms.GCRA {
	return algorithms.GCRA{MaxBurst: l.burst() - 1, Count: l.Requests, Period: int64(l.Window / unit)}
}

// ReserveParams returns l as Guava's reserve: Burst permits stored while
// idle, refilled at Requests per Window, waits up to MaxWait.
func (l *Limit) ReserveParams(unit time.Duration) algorithms.Reserve {
	return algorithms.Reserve{Rate: l.Requests, Period: int64(l.Window / unit), Burst: l.burst(), MaxWait: int64(l.MaxWait / unit)}
}

// burst returns l.Burst, or Requests when unset (a Limit built by hand).
func (l *Limit) burst() int64 {
	if l.Burst > 0 {
		return l.Burst
	}
	return l.Requests
}

// Params returns the parameters for l.Algorithm: an algorithms.FixedWindow,
// SlidingWindow, SlidingLog, TokenBucket, GCRA or Reserve value; nil when l is
// unlimited or its algorithm unknown. Boxing the value allocates: on a hot
// path, switch on l.Algorithm and call the typed method instead.
func (l *Limit) Params(unit time.Duration) any {
	if l.Unlimited || l.Requests == 0 {
		return nil
	}
	switch l.Algorithm {
	case algorithms.KindFixedWindow:
		return l.FixedWindowParams(unit)
	case algorithms.KindSlidingWindow:
		return l.SlidingWindowParams(unit)
	case algorithms.KindSlidingLog:
		return l.SlidingLogParams(unit)
	case algorithms.KindTokenBucket:
		return l.TokenBucketParams(unit)
	case algorithms.KindGCRA:
		return l.GCRAParams(unit)
	case algorithms.KindReserve:
		return l.ReserveParams(unit)
	}
	return nil
}

// validate checks l's parameters with package algorithms in the given unit.
func (l *Limit) validate(unit time.Duration) error {
	switch l.Algorithm {
	case algorithms.KindFixedWindow:
		return l.FixedWindowParams(unit).Validate()
	case algorithms.KindSlidingWindow:
		return l.SlidingWindowParams(unit).Validate()
	case algorithms.KindSlidingLog:
		return l.SlidingLogParams(unit).Validate()
	case algorithms.KindTokenBucket:
		return l.TokenBucketParams(unit).Validate()
	case algorithms.KindGCRA:
		return l.GCRAParams(unit).Validate()
	case algorithms.KindReserve:
		return l.ReserveParams(unit).Validate()
	}
	return nil
}
