// Package precheck decides locally, without I/O, that a request would be
// rejected by the global rate limiter, so that the filter can answer it
// without a call to the control plane.
//
// It remembers, per descriptor, two things the control plane told it:
//
//   - over-limit: the descriptor was denied, and the same request will not be
//     allowed before its retry-after has passed (other traffic only pushes
//     that later). Until then requests of at least that cost are rejected.
//   - the limit: a local token bucket is sized from the global limit so that
//     it admits every sequence of requests the global limiter admits, and it
//     is charged only with requests the control plane admitted. Everything
//     this instance's bucket has seen, the global limiter has admitted; so
//     when the local bucket has no room, the global limiter has none either.
//
// The invariant: under a fixed policy the precheck never rejects a request
// that the global limiter would have allowed. The argument, for a local
// bucket of rate r and burst b_L around a global limit that admits at most
// b_G + r*T in any interval of length T (an arrival curve):
//
//   - the bucket is charged at the time the admission is confirmed (or, for
//     an admission recorded without that time, at the table's next call
//     given a time: RecordAdmitted), at most D after the request was sent
//     and hence after the global decision; a request is checked locally at
//     most D before its global decision.
//   - so the local charges in (u, t] are global admissions in (u-D, t], and
//     a request allowed globally at g <= t+D satisfies
//     charges(u, t] + cost <= b_G + r*(t+D-(u-D)) = b_G + 2rD + r*(t-u).
//   - a bucket with b_L = b_G + ceil(2rD) (+1 for integer rounding) admits it.
//
// D is the call timeout: later responses are failures and charge nothing.
// Requests in flight are not charged (a request the control plane will deny
// must not hold local capacity), and denied or failed requests never are.
//
// The global admission curves, per algorithm (N per window W; algorithms):
//
//	fixed_window    any interval meets at most ceil(T/W)+1 windows: b_G = 2N, r = N/W
//	sliding_window  b_G = N + N/1000, r = N/W (see below)
//	sliding_log     at most N in any window W: b_G = N, r = N/W
//	token_bucket    b_G = Burst, r = Rate/Period
//	gcra            b_G = MaxBurst+1 (the capacity), r = one per emission interval, Period/Count
//	                rounded down in the global limiter's time unit (ns or, in
//	                Redis Lua, us): the local interval is taken 1us shorter
//	reserve         no local bucket (a request may borrow from the future);
//	                only the over-limit memory applies
//
// The sliding window counter's curve: take (u, t] with t at offset e into
// aligned window k, whose previous window admitted p <= N. Every admission in
// window k satisfied cur <= N - p*w(e') with w(e') >= w(e) = (W-e)/W, so
// window k's admissions up to t are at most N - p*(W-e)/W. If u lies in
// window k-1, the count is at most p + N - p*(W-e)/W = N + p*e/W <=
// N + N*(t-u)/W. If u lies further back, every aligned window in between
// admits at most N (its own count never exceeds N) and the same bound follows.
// The weights are rounded down to thousandths, which admits at most p/1000
// more: b_G = N + ceil(N/1000).
//
// Clocks: the global limiter's times may be whole microseconds, so each
// bound is widened by 1us (the latency slack uses D+1us, and an over-limit
// block ends 1us early).
package precheck

import (
	"math/bits"

	"github.com/sluicehq/sluice/algorithms"
)

// Limit is a global limit as the control plane describes it.
type Limit struct {
	Algorithm algorithms.Kind
	// Limit is requests per Window for the window algorithms, tokens added
	// per Window for token_bucket and reserve, and Count per Window for gcra.
	Limit int64
	// Window is the window or period, in nanoseconds.
	Window int64
	// Burst is the capacity, the most admitted at one instant: Burst for
	// token_bucket and reserve, MaxBurst+1 for gcra; unused otherwise.
	Burst int64
}

// unit is the time unit of the local buckets: microseconds, so that long
// windows and large bursts stay far from int64 overflow.
const unit = 1000

// maxLimit bounds limits and bursts the precheck sizes buckets for.
const maxLimit = int64(1) << 40

// curve returns the arrival curve of a global limit: a token bucket of rate
// tokens per period (ns) and burst that admits every sequence of requests
// the limit admits. ok is false when the precheck cannot bound the limit.
func curve(l Limit) (rate, period, burst int64, ok bool) {
	if l.Limit < 1 || l.Limit > maxLimit || l.Window < 1 || l.Burst < 0 || l.Burst > maxLimit {
		return 0, 0, 0, false
	}
	rate, period = l.Limit, l.Window
	switch l.Algorithm {
	case algorithms.KindFixedWindow:
		burst = 2 * l.Limit
	case algorithms.KindSlidingWindow:
		burst = l.Limit + (l.Limit+999)/1000
	case algorithms.KindSlidingLog:
		burst = l.Limit
	case algorithms.KindTokenBucket, algorithms.KindGCRA:
		if l.Burst < 1 {
			return 0, 0, 0, false
		}
		burst = l.Burst
		if l.Algorithm == algorithms.KindGCRA {
			// One request per emission interval, which the global limiter
			// rounds down in its unit; 1us less covers both units.
			rate, period = 1, l.Window/l.Limit-unit
		}
	default:
		return 0, 0, 0, false
	}
	return rate, period, burst, period >= 1
}

// localBucket returns the local token bucket for l, with latency bound
// delay (ns), or ok false when there is none (unknown algorithm, reserve,
// parameters out of range). Times of the bucket are in microseconds.
func localBucket(l Limit, delay int64) (b algorithms.TokenBucket, ok bool) {
	rate, period, burst, ok := curve(l)
	if !ok || delay < 0 {
		return b, false
	}
	period /= unit // rounding the period down only refills faster
	if period < 1 {
		return b, false
	}
	// Slack for the latency: ceil(2*(delay+1us)*rate/period) tokens, plus
	// one for rounding, computed in 128 bits.
	d := uint64((delay+unit-1)/unit) + 1
	hi, lo := bits.Mul64(2*d, uint64(rate))
	if hi >= uint64(period) {
		return b, false
	}
	q, rem := bits.Div64(hi, lo, uint64(period))
	if rem != 0 {
		q++
	}
	if q > uint64(maxLimit) {
		return b, false
	}
	slack := int64(q) + 1
	b = algorithms.TokenBucket{Rate: rate, Period: period, Burst: burst + slack}
	if b.Validate() != nil {
		return b, false
	}
	return b, true
}
