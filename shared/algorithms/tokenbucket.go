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
	if err := l.Validate(); err != nil {
		return Result{}, err
	}
	if err := checkCost(cost, l.Burst); err != nil {
		return Result{}, err
	}
	used := l.usedAt(*s, now)
	capacity := l.Burst * l.Period
	need := cost * l.Period
	r := Result{Limit: l.Burst}
	if used+need <= capacity {
		r.Allowed = true
		used += need
		s.Used = used
		if now > s.Last {
			s.Last = now
		}
	} else {
		r.RetryAfter = ceilDiv(used+need-capacity, l.Rate)
	}
	r.Remaining = nonNegative(capacity-used) / l.Period // a lowered limit can leave used > capacity
	r.ResetAfter = ceilDiv(used, l.Rate)
	return r, nil
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
