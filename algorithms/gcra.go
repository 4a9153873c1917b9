package algorithms

// GCRA is the generic cell rate algorithm (a leaky bucket as a meter) with
// redis-cell's CL.THROTTLE semantics:
//
//	CL.THROTTLE key max_burst count period [quantity]
//
// admits count per period with bursts of up to max_burst+1 at once. The
// emission interval is Period/Count, rounded down to the time unit as
// redis-cell rounds it to nanoseconds, and the delay variation tolerance is
// the emission interval times (MaxBurst+1).
//
// One deliberate difference: redis-cell compares the arrival time with the
// allowed time in whole seconds (it lets a request through up to one second
// early). This implementation compares exactly.
type GCRA struct {
	MaxBurst int64 // extra requests allowed at once beyond the first, >= 0
	Count    int64 // requests per Period, >= 1
	Period   int64 // > 0
}

// GCRAState is the theoretical arrival time of the next request; zero (or
// any time in the past) means a full limiter.
type GCRAState struct {
	TAT int64
}

// Validate reports whether the parameters are usable.
func (l GCRA) Validate() error {
	switch {
	case l.MaxBurst < 0:
		return ErrMaxBurst
	case l.Count < 1:
		return ErrCount
	case l.Period <= 0:
		return ErrPeriod
	case l.Period > maxSpan:
		return ErrPeriodTooLong
	case l.Period/l.Count == 0:
		return ErrCountTooHigh
	case l.MaxBurst+1 > maxSpan/(l.Period/l.Count):
		return ErrPeriodTooLong
	}
	return nil
}

// Interval returns the emission interval: the time one request's quota takes
// to come back.
func (l GCRA) Interval() int64 { return l.Period / l.Count }

// Allow decides a request of the given cost (redis-cell's quantity) at now.
func (l GCRA) Allow(s *GCRAState, now, cost int64) (Result, error) {
	return allowOn(l, s, now, cost)
}

// Probe reports whether a request of cost 1 would be allowed at now, taking
// nothing (see usage.go).
func (l GCRA) Probe(s *GCRAState, now int64) (Result, error) {
	return probeOn(l, s, now)
}

// Charge takes cost at now even past the limit, moving the theoretical
// arrival time past now+DVT (see usage.go).
func (l GCRA) Charge(s *GCRAState, now, cost int64) (Result, error) {
	return chargeOn(l, s, now, cost)
}

// Refund moves the theoretical arrival time back by amount emission
// intervals, never before now (see refund.go).
func (l GCRA) Refund(s *GCRAState, now, amount int64) (Result, error) {
	return refundOn(l, s, now, amount)
}

// check is Validate: any state fits l.
func (l GCRA) check(*GCRAState, int64) error { return l.Validate() }

// refund moves the TAT back by amount emission intervals, not before now.
func (l GCRA) refund(s *GCRAState, now, amount int64) {
	s.TAT = max(now, max(s.TAT, now)-amount*l.Interval())
}

// capacity is the largest cost a request may have.
func (l GCRA) capacity() int64 { return l.MaxBurst + 1 }

// decide is Allow, Probe and Charge: the request is allowed if need fits; an
// allowed request, or any charge, takes take.
func (l GCRA) decide(s *GCRAState, now, need, take int64, charge bool) Result {
	limit := l.MaxBurst + 1
	t := l.Interval()
	dvt := t * limit
	tat := s.TAT
	if tat < now {
		tat = now
	}
	r := Result{Limit: limit, Allowed: tat+t*need-dvt <= now}
	if r.Allowed || charge {
		tat = now + capped(tat-now, t*take, 2*dvt)
		s.TAT = tat
	}
	ttl := tat - now // time until the limiter is full again
	if !r.Allowed {
		if charge {
			need = 1 // the charge is taken: when would the next request pass
		}
		r.RetryAfter = tat + t*need - dvt - now
	}
	if next := dvt - ttl; next > 0 {
		r.Remaining = next / t
	}
	r.ResetAfter = ttl
	return r
}

// CellReply converts a GCRA result to redis-cell's CL.THROTTLE reply:
// [limited (0 or 1), limit, remaining, retry_after seconds or -1 when allowed,
// reset_after seconds], durations rounded up to whole seconds as redis-cell
// does. second is the length of one second in the unit of the result.
func CellReply(r Result, second int64) [5]int64 {
	reply := [5]int64{0, r.Limit, r.Remaining, -1, ceilDiv(r.ResetAfter, second)}
	if !r.Allowed {
		reply[0] = 1
		reply[3] = ceilDiv(r.RetryAfter, second)
	}
	return reply
}
