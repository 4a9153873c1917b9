package algorithms

// TokenBucket holds up to Burst tokens and refills Rate tokens per Period,
// continuously (fractional tokens accrue). A request takes cost tokens or, if
// there are not enough, is denied and takes nothing.
//
// The state counts tokens in units of 1/Period of a token, so refill is exact
// integer arithmetic: elapsed*Rate units arrive in elapsed time, and a bucket
// holds Burst*Period units. Validate refuses parameters for which that
// product would overflow.
type TokenBucket struct {
	Rate   int64 // tokens added per Period, >= 1
	Period int64 // > 0
	Burst  int64 // bucket capacity in tokens, >= 1
}

// TokenBucketState is a bucket's state, kept as what is missing from a full
// bucket so that the zero value is a full bucket.
type TokenBucketState struct {
	Last int64 // when Used was last brought up to date
	Used int64 // units missing from a full bucket (tokens * Period)
}

// Validate reports whether the parameters are usable.
func (l TokenBucket) Validate() error { return validateRate(l.Rate, l.Period, l.Burst) }

// Allow decides a request of the given cost at now.
func (l TokenBucket) Allow(s *TokenBucketState, now, cost int64) (Result, error) {
	return allowOn(l, s, now, cost)
}

// Probe reports whether a request of cost 1 would be allowed at now, taking
// nothing (see usage.go).
func (l TokenBucket) Probe(s *TokenBucketState, now int64) (Result, error) {
	return probeOn(l, s, now)
}

// Charge takes cost tokens at now even past the limit, leaving the bucket in
// debt (see usage.go).
func (l TokenBucket) Charge(s *TokenBucketState, now, cost int64) (Result, error) {
	return chargeOn(l, s, now, cost)
}

// Refund puts amount tokens back, never above Burst (see refund.go).
func (l TokenBucket) Refund(s *TokenBucketState, now, amount int64) (Result, error) {
	return refundOn(l, s, now, amount)
}

// check is Validate: any state fits l.
func (l TokenBucket) check(*TokenBucketState, int64) error { return l.Validate() }

// refund puts amount tokens back into the bucket refilled to now.
func (l TokenBucket) refund(s *TokenBucketState, now, amount int64) {
	s.Used = max(0, l.usedAt(*s, now)-amount*l.Period)
	s.Last = max(s.Last, now)
}

// capacity is the largest cost a request may have.
func (l TokenBucket) capacity() int64 { return l.Burst }

// decide is Allow, Probe and Charge: the request is allowed if need tokens
// are there; an allowed request, or any charge, takes take.
func (l TokenBucket) decide(s *TokenBucketState, now, need, take int64, charge bool) Result {
	used := l.usedAt(*s, now)
	capacity := l.Burst * l.Period
	r := Result{Limit: l.Burst, Allowed: used+need*l.Period <= capacity}
	if r.Allowed || charge {
		used = capped(used, take*l.Period, 2*capacity)
		s.Used = used
		if now > s.Last {
			s.Last = now
		}
	}
	if !r.Allowed {
		if charge {
			need = 1 // the charge is taken: when would the next request pass
		}
		r.RetryAfter = ceilDiv(used+need*l.Period-capacity, l.Rate)
	}
	r.Remaining = nonNegative(capacity-used) / l.Period // a lowered limit can leave used > capacity
	r.ResetAfter = ceilDiv(used, l.Rate)
	return r
}

// usedAt returns the units missing at now, after refilling since s.Last.
// A clock that steps back refills nothing.
func (l TokenBucket) usedAt(s TokenBucketState, now int64) int64 {
	elapsed := now - s.Last
	if elapsed <= 0 {
		return s.Used
	}
	if elapsed > s.Used/l.Rate { // also guards elapsed*Rate from overflowing
		return 0
	}
	return s.Used - elapsed*l.Rate
}
