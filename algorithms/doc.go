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
// Kind names the algorithms and Unit the rate-limit units, as policies,
// stores and the filter name them.
//
// FixedWindow, SlidingWindow and SlidingLog also count calendar windows,
// whose lengths differ (days across a daylight-saving change, months): the
// caller passes the Periods around now with each call (periods.go).
//
// # Probes and charges (usage.go)
//
// Allow decides a request before it runs: it is admitted and takes its cost,
// or is denied and takes nothing. Limits on usage that is only known after
// the fact (tokens of an LLM response, bytes of a download) need two more
// operations, which every algorithm has:
//
//   - Probe(s, now) asks whether the smallest request (cost 1) would be
//     admitted now, and takes nothing. Remaining is the true remaining, so a
//     client sees it fall as usage is charged; when nothing remains the probe
//     is denied, with RetryAfter until a cost-1 request would pass. (Allow
//     with cost 0 is the older peek: it is always allowed unless the limiter
//     is past its limit.)
//   - Charge(s, now, cost) records usage that already happened: it takes cost
//     even past the limit, so later requests are refused until the limiter
//     has freed it. Allowed reports whether the charge fitted within the
//     limit; when it did not, RetryAfter is how long until a cost-1 request
//     would pass. A cost above the capacity is accepted.
//
// What a charge past the limit leaves, per algorithm ("debt"):
//
//   - FixedWindow: the window's count passes Limit; every request is refused
//     until the window ends, which forgets it.
//   - SlidingWindow: the current window's count passes Limit; it then weighs
//     on the next window as the previous count, so the refusals last into the
//     next window until the weighted estimate falls below Limit.
//   - SlidingLog: the charge is an entry like any other and leaves the window
//     Window after it was charged. When the log already holds Limit entries
//     it is merged into the newest entry, whose time becomes the charge's
//     (it then leaves no earlier than the usage it stands for).
//   - TokenBucket: the bucket goes below zero tokens; refill pays the debt
//     first.
//   - GCRA: the theoretical arrival time moves past now+DVT; requests are
//     refused until time catches up.
//   - Reserve: the stored permits are spent and the free ticket (Next) moves
//     forward: later requests wait (or, past MaxWait, are refused) until the
//     debt is paid.
//
// Debt is bounded: a charge never leaves more than twice the capacity in use
// (a count of 2*Limit, a bucket at -Burst, a TAT at now+2*DVT, a free ticket
// at most Burst/Rate periods ahead), so one runaway charge (a bogus usage
// count) locks a key out for at most about one more window or refill, and
// the arithmetic stays exact (also in the Redis Lua ports, under 2^53).
// Charges never lower a state already past that ceiling (a limit lowered
// under existing state).
//
// # Refunds (refund.go)
//
// Refund(s, now, amount) undoes up to amount of what the limiter took
// (usage reserved before a request and found smaller once it ended, a
// request the upstream did not serve): Envoy's is_negative_hits, and the
// refunds of sluice's settlements. It is never refused, and answers the
// state after it as a peek (Allow with cost 0) would: Allowed unless the
// limiter is still past its limit, Remaining the true remaining.
//
// What a refund gives back, per algorithm, and its floor (a refund never
// leaves a limiter fuller than a fresh one, so refunds of usage the limiter
// already forgot give nothing):
//
//   - FixedWindow: the count of the window open now falls by amount, never
//     below 0. Usage counted in an earlier window is gone already: its
//     refund gives back from the current window what it holds.
//   - SlidingWindow: the current window's count falls, never below 0; the
//     previous window's count, already fading, is left as it is.
//   - SlidingLog: the newest entries are removed (the last one in part),
//     as many as amount; entries that left the window are not refunded.
//   - TokenBucket: amount tokens go back into the bucket, never above its
//     Burst.
//   - GCRA: the theoretical arrival time moves back by amount emission
//     intervals, never before now.
//   - Reserve: the free ticket moves back by the time amount permits take
//     to accrue (rounded down), never before now; what is left of amount
//     goes back into the stored permits, never above Burst.
//
// Net of refunds no limiter admits more than its bound: over any window
// (per period for FixedWindow and SlidingWindow, over every sliding window
// for SlidingLog, over every interval for the rate-based ones), what was
// admitted less what was refunded stays within what the algorithm promises
// without refunds (property_test.go checks it). A refund only gives back
// what a caller took before; that it did is the caller's promise (sluice's
// control plane applies each settlement's refund once).
//
// amount is clamped at twice the capacity, the most a limiter ever holds
// (see usage.go's debt ceiling): refunding more leaves the same state.
package algorithms
