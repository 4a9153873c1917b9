package algorithms

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
