package algorithms

// Refunds: capacity given back.
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

// refundOn is an algorithm's Refund.
func refundOn[D decider[S], S any](d D, s S, now, amount int64) (Result, error) {
	if err := d.check(s, now); err != nil {
		return Result{}, err
	}
	amount, err := chargeCost(amount, d.capacity())
	if err != nil {
		return Result{}, err
	}
	d.refund(s, now, amount)
	return d.decide(s, now, 0, 0, false), nil
}
