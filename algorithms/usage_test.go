package algorithms

import (
	"math/rand"
	"testing"
)

// usageSubject is a subject that also probes and charges.
type usageSubject interface {
	subject
	probe(now int64) (Result, error)
	charge(now, cost int64) (Result, error)
	// debtReset bounds ResetAfter after any charge: the debt ceiling.
	debtReset() int64
}

func (x *fixedSubject) probe(now int64) (Result, error)        { return x.l.Probe(&x.s, now) }
func (x *fixedSubject) charge(now, cost int64) (Result, error) { return x.l.Charge(&x.s, now, cost) }
func (x *fixedSubject) debtReset() int64                       { return x.l.Window }
func (x *logSubject) probe(now int64) (Result, error)          { return x.l.Probe(x.s, now) }
func (x *logSubject) charge(now, cost int64) (Result, error)   { return x.l.Charge(x.s, now, cost) }
func (x *logSubject) debtReset() int64                         { return x.l.Window }
func (x *slidingSubject) probe(now int64) (Result, error)      { return x.l.Probe(&x.s, now) }
func (x *slidingSubject) charge(now, cost int64) (Result, error) {
	return x.l.Charge(&x.s, now, cost)
}
func (x *slidingSubject) debtReset() int64                      { return 2 * x.l.Window }
func (x *bucketSubject) probe(now int64) (Result, error)        { return x.l.Probe(&x.s, now) }
func (x *bucketSubject) charge(now, cost int64) (Result, error) { return x.l.Charge(&x.s, now, cost) }
func (x *bucketSubject) debtReset() int64 {
	return ceilDiv(2*x.l.Burst*x.l.Period, x.l.Rate)
}
func (x *gcraSubject) probe(now int64) (Result, error)        { return x.l.Probe(&x.s, now) }
func (x *gcraSubject) charge(now, cost int64) (Result, error) { return x.l.Charge(&x.s, now, cost) }
func (x *gcraSubject) debtReset() int64                       { return 2 * x.l.Interval() * (x.l.MaxBurst + 1) }
func (x *reserveSubject) probe(now int64) (Result, error)     { return x.l.Probe(&x.s, now) }
func (x *reserveSubject) charge(now, cost int64) (Result, error) {
	return x.l.Charge(&x.s, now, cost)
}
func (x *reserveSubject) debtReset() int64 {
	return x.l.MaxWait + 2*ceilDiv(x.l.Burst*x.l.Period, x.l.Rate)
}

// TestProbeAndCharge is the usage-based scenario on every algorithm: a limit
// of 10 per 1000, probes report the true remaining, a charge past the limit
// is taken, probes are then refused until RetryAfter, and not one unit
// earlier.
func TestProbeAndCharge(t *testing.T) {
	const w = 1000
	subjects := map[string]usageSubject{
		"fixed_window":   &fixedSubject{l: FixedWindow{Limit: 10, Window: w, Aligned: true}},
		"sliding_window": &slidingSubject{l: SlidingWindow{Limit: 10, Window: w}},
		"sliding_log":    &logSubject{SlidingLog{Limit: 10, Window: w}, SlidingLog{Limit: 10, Window: w}.NewState()},
		"token_bucket":   &bucketSubject{l: TokenBucket{Rate: 10, Period: w, Burst: 10}},
		"gcra":           &gcraSubject{l: GCRA{MaxBurst: 9, Count: 10, Period: w}},
		"reserve":        &reserveSubject{l: Reserve{Rate: 10, Period: w, Burst: 10}},
	}
	for name, x := range subjects {
		t.Run(name, func(t *testing.T) {
			now := int64(10 * w)
			step := func(what string, r Result, err error, allowed bool, remaining int64) Result {
				t.Helper()
				if err != nil || r.Allowed != allowed || r.Remaining != remaining {
					t.Fatalf("%s: %+v, %v; want allowed %v, remaining %d", what, r, err, allowed, remaining)
				}
				return r
			}
			r, err := x.probe(now)
			step("probe of a fresh limiter", r, err, true, 10)
			r, err = x.charge(now, 7)
			step("charge 7", r, err, true, 3)
			r, err = x.probe(now)
			step("probe after 7", r, err, true, 3)
			r, err = x.charge(now, 7)
			// A reservation is granted whatever the debt: the next caller
			// pays it by waiting.
			reserve := name == "reserve"
			step("charge 7 past the limit", r, err, reserve, 0)
			if r.RetryAfter <= 0 && !reserve {
				t.Fatalf("charge past the limit: RetryAfter %d", r.RetryAfter)
			}
			retry := r.RetryAfter
			r, err = x.probe(now)
			step("probe in debt", r, err, false, 0)
			if reserve {
				retry = r.RetryAfter
			}
			if r.RetryAfter != retry {
				t.Fatalf("probe in debt: RetryAfter %d, the charge said %d", r.RetryAfter, retry)
			}
			if r, err = x.allow(now, 0); err != nil || r.Allowed {
				t.Fatalf("a cost-0 Allow (peek) in debt: %+v %v", r, err)
			}
			early := x.clone().(usageSubject)
			if r, _ := early.probe(now + retry - 1); r.Allowed && name != "reserve" {
				t.Fatalf("probe allowed 1 before RetryAfter: %+v", r)
			}
			if r, _ := x.probe(now + retry); !r.Allowed {
				t.Fatalf("probe at RetryAfter %d: %+v", retry, r)
			}
		})
	}
}

// TestChargeCeiling: a runaway charge (far above the capacity) is accepted,
// but leaves at most twice the capacity in use, so the limiter is full again
// within the debt bound of its algorithm.
func TestChargeCeiling(t *testing.T) {
	rng := rand.New(rand.NewSource(5))
	for _, name := range propertyAlgorithms {
		for range 200 {
			x := randomSubjects(rng, name).(usageSubject)
			now := rng.Int63n(1 << 40)
			r, err := x.charge(now, 1<<40)
			if err != nil || (r.Allowed && name != "reserve") || r.Remaining != 0 {
				t.Fatalf("%s: runaway charge: %+v %v", name, r, err)
			}
			if r.ResetAfter > x.debtReset() {
				t.Fatalf("%s %+v: ResetAfter %d past the debt bound %d", name, x, r.ResetAfter, x.debtReset())
			}
			if r, _ := x.probe(now + x.debtReset()); !r.Allowed {
				t.Fatalf("%s: still refused after the debt bound: %+v", name, r)
			}
		}
	}
	if _, err := (FixedWindow{Limit: 1, Window: 1}).Charge(&FixedWindowState{}, 0, -1); err != ErrCostNegative {
		t.Fatalf("negative charge: %v", err)
	}
}

// TestUsageProperties runs random sequences of Allow, Probe and Charge and
// checks after every step: a probe answers exactly what a cost-1 Allow would
// (allowed, remaining, RetryAfter; reserve: cost 0) and changes nothing a
// later request can see; a charge that did not fit is refused to every
// request until its RetryAfter (and not one unit less), leaves the limiter
// full after ResetAfter, and stays within the debt bound.
func TestUsageProperties(t *testing.T) {
	for _, name := range propertyAlgorithms {
		t.Run(name, func(t *testing.T) {
			rng := rand.New(rand.NewSource(int64(len(name)) * 104729))
			for range 60 {
				x := randomSubjects(rng, name).(usageSubject)
				now := rng.Int63n(1 << 40)
				for range 300 {
					switch rng.Intn(4) {
					case 0:
					case 1:
						now += rng.Int63n(5)
					default:
						now += rng.Int63n(400)
					}
					cost := 1 + rng.Int63n(2*x.capacity())
					before := x.clone().(usageSubject)
					var r Result
					var err error
					switch rng.Intn(3) {
					case 0:
						r, err = x.allow(now, min(cost, x.capacity()))
					case 1:
						r, err = x.probe(now)
						probeCost := int64(1)
						if name == "reserve" {
							probeCost = 0
						}
						want, _ := before.clone().allow(now, probeCost)
						if err != nil || r.Allowed != want.Allowed || r.RetryAfter != want.RetryAfter {
							t.Fatalf("%s %+v at %d: probe %+v %v, a cost-%d Allow %+v", name, before, now, r, err, probeCost, want)
						}
						peek, _ := before.clone().allow(now, 0)
						if r.Remaining != peek.Remaining || r.ResetAfter != peek.ResetAfter {
							t.Fatalf("%s: probe %+v, peek %+v", name, r, peek)
						}
						a, _ := x.clone().allow(now+1, 1)
						b, _ := before.clone().allow(now+1, 1)
						if a != b {
							t.Fatalf("%s: the probe changed a later answer: %+v, without it %+v", name, a, b)
						}
					case 2:
						r, err = x.charge(now, cost)
						if err != nil {
							t.Fatal(err)
						}
						if r.ResetAfter > x.debtReset() {
							t.Fatalf("%s: ResetAfter %d past the debt bound %d", name, r.ResetAfter, x.debtReset())
						}
						if !r.Allowed {
							if p, _ := x.clone().(usageSubject).probe(now + r.RetryAfter); !p.Allowed {
								t.Fatalf("%s: refused at the charge's RetryAfter %d: %+v", name, r.RetryAfter, p)
							}
							if p, _ := x.clone().(usageSubject).probe(now + r.RetryAfter - 1); p.Allowed && name != "reserve" {
								t.Fatalf("%s: allowed before the charge's RetryAfter %d: %+v", name, r.RetryAfter, p)
							}
						}
					}
					if err != nil {
						t.Fatal(err)
					}
					if r.Remaining < 0 || r.Remaining > r.Limit || (!r.Allowed && r.RetryAfter <= 0) {
						t.Fatalf("%s: bad result %+v", name, r)
					}
					if fr, _ := x.clone().allow(now+r.ResetAfter, 0); fr.Remaining != fr.Limit {
						t.Fatalf("%s: not full after ResetAfter %d: %+v", name, r.ResetAfter, fr)
					}
				}
			}
		})
	}
}
