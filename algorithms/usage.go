package algorithms

// Usage-based limiting: probes and charges.
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

// capped returns v+add, or, when that passes ceiling, the larger of v and
// ceiling: a charge fills up to the ceiling but never lowers a state above
// it. add is at most 2*capacity (see chargeCost).
func capped(v, add, ceiling int64) int64 {
	if v+add <= ceiling {
		return v + add
	}
	return max(v, ceiling)
}

// chargeCost validates a charge's cost and clamps it to twice the capacity,
// the most a charge can record (see the debt ceiling above).
func chargeCost(cost, capacity int64) (int64, error) {
	if cost < 0 {
		return 0, ErrCostNegative
	}
	return min(cost, 2*capacity), nil
}

// decider is an algorithm whose Allow, Probe and Charge differ only in what
// they give its decide: how much must fit (need), how much an admitted
// request or a charge takes (take), and whether it takes it anyway (charge).
// Reserve, whose grant does not depend on the cost, has its own.
type decider[S any] interface {
	check(s S, now int64) error // the parameters are usable at now and s fits them
	capacity() int64            // the largest cost a request may have
	decide(s S, now, need, take int64, charge bool) Result
	refund(s S, now, amount int64) // gives amount back (see refund.go)
}

// allowOn is an algorithm's Allow: cost must fit, and an admitted request
// takes it.
func allowOn[D decider[S], S any](d D, s S, now, cost int64) (Result, error) {
	if err := d.check(s, now); err != nil {
		return Result{}, err
	}
	if err := checkCost(cost, d.capacity()); err != nil {
		return Result{}, err
	}
	return d.decide(s, now, cost, cost, false), nil
}

// probeOn is an algorithm's Probe: a cost of 1 must fit, and nothing is taken.
func probeOn[D decider[S], S any](d D, s S, now int64) (Result, error) {
	if err := d.check(s, now); err != nil {
		return Result{}, err
	}
	return d.decide(s, now, 1, 0, false), nil
}

// chargeOn is an algorithm's Charge: cost, clamped by chargeCost, is taken
// even past the limit.
func chargeOn[D decider[S], S any](d D, s S, now, cost int64) (Result, error) {
	if err := d.check(s, now); err != nil {
		return Result{}, err
	}
	cost, err := chargeCost(cost, d.capacity())
	if err != nil {
		return Result{}, err
	}
	return d.decide(s, now, cost, cost, true), nil
}
