package algorithms

// Reserve is Guava's SmoothBursty rate limiter with tryAcquire(permits,
// timeout) semantics: instead of refusing a request it tells the caller how
// long to wait, up to MaxWait.
//
// Permits accrue at Rate per Period and up to Burst are stored while the
// limiter is idle. A request spends stored permits first; the permits it needs
// beyond those are paid for by the caller after it (Guava's "pay later"): the
// request's own wait is only what earlier requests left owing. If that wait
// would exceed MaxWait the request is refused, takes nothing, and Result.Wait
// says how long it would have had to wait.
//
// Unlike a fresh Guava limiter, which starts with nothing stored, the zero
// state here is a full one: a limiter nobody used for long is full.
type Reserve struct {
	Rate    int64 // permits per Period, >= 1
	Period  int64 // > 0
	Burst   int64 // permits stored while idle, >= 1
	MaxWait int64 // longest wait granted, >= 0
}

// ReserveState is Guava's (storedPermits, nextFreeTicketMicros), kept as
// what is missing from a full store so that the zero value is full.
type ReserveState struct {
	Next    int64 // when the next request may proceed (the free ticket)
	Missing int64 // units (permits * Period) missing from a full store at Next
}

// Validate reports whether the parameters are usable.
func (l Reserve) Validate() error {
	if l.MaxWait < 0 {
		return ErrMaxWait
	}
	return validateRate(l.Rate, l.Period, l.Burst)
}

// Allow reserves cost permits at now. Result.Wait is how long the caller must
// wait before proceeding; a refused request (wait beyond MaxWait) has
// RetryAfter set to how long until its wait would be within MaxWait.
func (l Reserve) Allow(s *ReserveState, now, cost int64) (Result, error) {
	if err := l.Validate(); err != nil {
		return Result{}, err
	}
	if err := checkCost(cost, l.Burst); err != nil {
		return Result{}, err
	}
	return l.decide(s, now, cost, false), nil
}

// Probe reports whether a request would be granted at now (its wait within
// MaxWait), taking nothing: Allow with cost 0, as a reservation's grant does
// not depend on its cost (see usage.go).
func (l Reserve) Probe(s *ReserveState, now int64) (Result, error) {
	if err := l.Validate(); err != nil {
		return Result{}, err
	}
	return l.decide(s, now, 0, false), nil
}

// Charge takes cost at now whatever the wait: the stored permits are spent
// and the free ticket moves forward, at most Burst/Rate periods ahead of now
// (see usage.go).
func (l Reserve) Charge(s *ReserveState, now, cost int64) (Result, error) {
	if err := l.Validate(); err != nil {
		return Result{}, err
	}
	cost, err := chargeCost(cost, l.Burst)
	if err != nil {
		return Result{}, err
	}
	return l.decide(s, now, cost, true), nil
}

// Refund moves the free ticket back by the time amount permits take to
// accrue (rounded down), never before now, and puts what is left of amount
// back into the stored permits, never above Burst (see refund.go). It
// answers the state after it as Probe would.
func (l Reserve) Refund(s *ReserveState, now, amount int64) (Result, error) {
	if err := l.Validate(); err != nil {
		return Result{}, err
	}
	amount, err := chargeCost(amount, l.Burst)
	if err != nil {
		return Result{}, err
	}
	next, missing := l.resync(*s, now)
	units := amount * l.Period
	back := min(next-now, units/l.Rate) // undo what later callers were to pay
	next -= back
	if next == now {
		missing = max(0, missing-(units-back*l.Rate))
	}
	s.Next, s.Missing = next, missing
	return l.decide(s, now, 0, false), nil
}

// resync returns the state at now: the permits stored while idle counted,
// and the free ticket not before now.
func (l Reserve) resync(s ReserveState, now int64) (next, missing int64) {
	next, missing = s.Next, s.Missing
	if now > next {
		elapsed := now - next
		if elapsed > missing/l.Rate {
			missing = 0
		} else {
			missing -= elapsed * l.Rate
		}
		next = now
	}
	return next, missing
}

// decide is Allow, Probe and Charge: the request is granted if its wait is
// within MaxWait; a granted request, or any charge, takes cost.
func (l Reserve) decide(s *ReserveState, now, cost int64, charge bool) Result {
	next, missing := l.resync(*s, now) // permits stored while idle
	capacity := l.Burst * l.Period
	r := Result{Limit: l.Burst, Wait: next - now}
	r.Allowed = r.Wait <= l.MaxWait
	if r.Allowed || charge {
		need := cost * l.Period
		stored := capacity - missing
		spend := min(need, stored)
		missing += spend
		ahead := next
		next += ceilDiv(need-spend, l.Rate) // the rest is paid by the next caller
		if charge {
			next = min(next, max(ahead, now+ceilDiv(capacity, l.Rate))) // the debt ceiling
		}
		s.Next, s.Missing = next, missing
	}
	if !r.Allowed { // a charge may have moved the free ticket
		r.Wait = next - now
		r.RetryAfter = r.Wait - l.MaxWait
	}
	if next <= now {
		r.Remaining = nonNegative(capacity-missing) / l.Period // a lowered burst can leave missing > capacity
	}
	r.ResetAfter = max(next-now, 0) + ceilDiv(missing, l.Rate)
	return r
}
