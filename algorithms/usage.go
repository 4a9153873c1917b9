package algorithms

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
