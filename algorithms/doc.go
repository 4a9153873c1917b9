// Package algorithms holds sluice's rate-limiting algorithms as pure functions.
// It stands at the module's root, beside controlplane/ and filter/, because
// both run it, and its name says what it holds: the algorithms, nothing else.
//
// Every algorithm is a small limit value (its parameters), a small state value,
// and a method
//
//	func (l Limit) Allow(s *State, now, cost int64) (Result, error)
//
// that decides one request of the given cost at time now and updates the state
// in place. The functions read no clock, use no maps, start no goroutines and
// allocate nothing, so the same code runs natively in the control plane, inside
// the filter's Wasm module, and as the oracle against which the Redis Lua
// scripts are tested.
//
// Times and durations are plain int64 values in one unit of the caller's
// choosing. sluice uses nanoseconds in Go and microseconds in Redis Lua (where
// numbers are doubles, exact only up to 2^53); the algorithms do not care, as
// long as now, windows, periods and the returned durations share the unit.
//
// The zero value of every state means "fresh": a limiter that has seen nothing
// (a missing Redis key) is full. A denied request never consumes capacity. On
// error the state is left unchanged.
//
// The algorithms and what they promise:
//
//   - FixedWindow: at most Limit per window; windows aligned to the clock or
//     starting at the first hit (INCR+EXPIRE). Exact per window, but up to
//     2*Limit can pass within a short interval straddling a boundary.
//   - SlidingLog: at most Limit in every half-open interval (t-Window, t].
//     Exact; memory grows with Limit.
//   - SlidingWindow: the two-window weighted counter; O(1) memory, approximate
//     (see SlidingWindow for the error bound).
//   - TokenBucket: Burst tokens, refilled at Rate per Period, fractionally.
//   - GCRA: the generic cell rate algorithm with redis-cell's CL.THROTTLE
//     semantics and reply (see GCRA and CellReply).
//   - Reserve: Guava's SmoothBursty "reserve and wait": the caller is told how
//     long to wait instead of being refused, up to MaxWait.
//
// Besides Allow, every algorithm has Probe and Charge (usage known after the
// fact, usage.go) and Refund (capacity given back, refund.go). FixedWindow,
// SlidingWindow and SlidingLog also count calendar windows, whose lengths
// differ (days across a daylight-saving change, months): the caller passes
// the Periods around now with each call (periods.go).
package algorithms
