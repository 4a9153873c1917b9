package algorithms

import (
	"cmp"
	"math/rand"
	"slices"
	"testing"
)

// subject adapts one algorithm and its state for the property tests.
type subject interface {
	allow(now, cost int64) (Result, error)
	refund(now, amount int64) (Result, error)
	clone() subject
	capacity() int64
}

type fixedSubject struct {
	l FixedWindow
	s FixedWindowState
}

func (x *fixedSubject) allow(now, cost int64) (Result, error) { return x.l.Allow(&x.s, now, cost) }
func (x *fixedSubject) refund(now, amount int64) (Result, error) {
	return x.l.Refund(&x.s, now, amount)
}
func (x *fixedSubject) clone() subject  { c := *x; return &c }
func (x *fixedSubject) capacity() int64 { return x.l.Limit }

type logSubject struct {
	l SlidingLog
	s *SlidingLogState
}

func (x *logSubject) allow(now, cost int64) (Result, error)    { return x.l.Allow(x.s, now, cost) }
func (x *logSubject) refund(now, amount int64) (Result, error) { return x.l.Refund(x.s, now, amount) }
func (x *logSubject) clone() subject {
	s := *x.s
	s.ring = append([]logEntry(nil), x.s.ring...)
	return &logSubject{x.l, &s}
}
func (x *logSubject) capacity() int64 { return x.l.Limit }

type slidingSubject struct {
	l SlidingWindow
	s SlidingWindowState
}

func (x *slidingSubject) allow(now, cost int64) (Result, error) { return x.l.Allow(&x.s, now, cost) }
func (x *slidingSubject) refund(now, amount int64) (Result, error) {
	return x.l.Refund(&x.s, now, amount)
}
func (x *slidingSubject) clone() subject  { c := *x; return &c }
func (x *slidingSubject) capacity() int64 { return x.l.Limit }

type bucketSubject struct {
	l TokenBucket
	s TokenBucketState
}

func (x *bucketSubject) allow(now, cost int64) (Result, error) { return x.l.Allow(&x.s, now, cost) }
func (x *bucketSubject) refund(now, amount int64) (Result, error) {
	return x.l.Refund(&x.s, now, amount)
}
func (x *bucketSubject) clone() subject  { c := *x; return &c }
func (x *bucketSubject) capacity() int64 { return x.l.Burst }

type gcraSubject struct {
	l GCRA
	s GCRAState
}

func (x *gcraSubject) allow(now, cost int64) (Result, error)    { return x.l.Allow(&x.s, now, cost) }
func (x *gcraSubject) refund(now, amount int64) (Result, error) { return x.l.Refund(&x.s, now, amount) }
func (x *gcraSubject) clone() subject                           { c := *x; return &c }
func (x *gcraSubject) capacity() int64                          { return x.l.MaxBurst + 1 }

type reserveSubject struct {
	l Reserve
	s ReserveState
}

func (x *reserveSubject) allow(now, cost int64) (Result, error) { return x.l.Allow(&x.s, now, cost) }
func (x *reserveSubject) refund(now, amount int64) (Result, error) {
	return x.l.Refund(&x.s, now, amount)
}
func (x *reserveSubject) clone() subject  { c := *x; return &c }
func (x *reserveSubject) capacity() int64 { return x.l.Burst }

// admission is one admitted request.
type admission struct{ at, cost int64 }

// randomLimits returns n subjects of one algorithm with random parameters.
func randomSubjects(rng *rand.Rand, name string) subject {
	limit := 1 + rng.Int63n(50)
	window := 1 + rng.Int63n(5000)
	switch name {
	case "fixed_aligned":
		return &fixedSubject{l: FixedWindow{Limit: limit, Window: window, Aligned: true}}
	case "fixed_first_hit":
		return &fixedSubject{l: FixedWindow{Limit: limit, Window: window}}
	case "sliding_log":
		l := SlidingLog{Limit: limit, Window: window}
		return &logSubject{l, l.NewState()}
	case "sliding_window":
		return &slidingSubject{l: SlidingWindow{Limit: limit, Window: window}}
	case "token_bucket":
		return &bucketSubject{l: TokenBucket{Rate: 1 + rng.Int63n(20), Period: window, Burst: limit}}
	case "gcra":
		count := 1 + rng.Int63n(20)
		return &gcraSubject{l: GCRA{MaxBurst: limit - 1, Count: count, Period: count * (1 + rng.Int63n(300))}}
	case "reserve":
		return &reserveSubject{l: Reserve{Rate: 1 + rng.Int63n(20), Period: window, Burst: limit, MaxWait: rng.Int63n(2 * window)}}
	}
	panic("unknown algorithm " + name)
}

var propertyAlgorithms = []string{"fixed_aligned", "fixed_first_hit", "sliding_log", "sliding_window", "token_bucket", "gcra", "reserve"}

// TestProperties runs random sequences (fixed seeds, 20k steps per algorithm)
// and checks, after every step: remaining is never negative nor above the
// limit; a denied request retried exactly at RetryAfter is allowed; after
// ResetAfter the limiter is full; and the algorithm's own admission bound over
// every window holds for the whole sequence.
func TestProperties(t *testing.T) {
	for _, name := range propertyAlgorithms {
		t.Run(name, func(t *testing.T) {
			rng := rand.New(rand.NewSource(int64(len(name)) * 7919))
			for steps := 0; steps < 20000; steps += sequence {
				x := randomSubjects(rng, name)
				checkBound(t, name, x, exercise(t, name, rng, x, rng.Int63n(1<<40), false))
			}
		})
	}
}

// sequence is how many steps exercise takes.
const sequence = 400

// exercise drives x from now through a random sequence of requests (and, with
// refunds, refunds of part of what was admitted last), checking each
// result as TestProperties says, and returns what was admitted, refunds as
// negative costs.
func exercise(t *testing.T, name string, rng *rand.Rand, x subject, now int64, refunds bool) []admission {
	t.Helper()
	var admitted []admission
	var last, lastAt int64 // what the last admission took and no refund gave back yet, and when it proceeds
	for range sequence {
		switch rng.Intn(4) {
		case 0: // same instant: bursts
		case 1:
			now += rng.Int63n(5)
		default:
			now += rng.Int63n(400)
		}
		if refunds && last > 0 && rng.Intn(3) == 0 {
			amount := 1 + rng.Int63n(last)
			last -= amount
			// A refund cancels part of the admission: reserve's may
			// proceed later than now.
			admitted = append(admitted, admission{max(now, lastAt), -amount})
			checkRefund(t, name, x, now, amount)
			continue
		}
		cost := rng.Int63n(x.capacity() + 1)
		if rng.Intn(3) > 0 {
			cost = min(cost, 1+rng.Int63n(3))
		}
		before := x.clone()
		r, err := x.allow(now, cost)
		if err != nil {
			t.Fatalf("%+v at %d cost %d: %v", before, now, cost, err)
		}
		if r.Remaining < 0 || r.Remaining > r.Limit || r.Limit != x.capacity() {
			t.Fatalf("bad remaining/limit %+v", r)
		}
		if r.Allowed {
			if r.RetryAfter != 0 {
				t.Fatalf("allowed with RetryAfter %d", r.RetryAfter)
			}
			if cost > 0 {
				admitted = append(admitted, admission{now + r.Wait, cost})
				last, lastAt = cost, now+r.Wait
			}
		} else {
			if r.RetryAfter <= 0 {
				t.Fatalf("denied with RetryAfter %d: %+v", r.RetryAfter, r)
			}
			retry := before.clone()
			if rr, _ := retry.allow(now+r.RetryAfter, cost); !rr.Allowed {
				t.Fatalf("%s %+v: denied at %d cost %d, RetryAfter %d, but the retry was denied: %+v", name, before, now, cost, r.RetryAfter, rr)
			}
			if r.RetryAfter > 1 && name != "reserve" {
				early := before.clone()
				if er, _ := early.allow(now+r.RetryAfter-1, cost); er.Allowed {
					t.Fatalf("%s: RetryAfter %d is not the earliest: allowed 1 earlier", name, r.RetryAfter)
				}
			}
		}
		if r.ResetAfter < 0 {
			t.Fatalf("negative ResetAfter %+v", r)
		}
		full := x.clone()
		if fr, _ := full.allow(now+r.ResetAfter, 0); fr.Remaining != fr.Limit {
			t.Fatalf("%s: not full after ResetAfter %d: %+v", name, r.ResetAfter, fr)
		}
	}
	return admitted
}

// checkBound checks the admission bound each algorithm promises over the
// admitted requests of one sequence.
func checkBound(t *testing.T, name string, x subject, adm []admission) {
	t.Helper()
	switch x := x.(type) {
	case *fixedSubject:
		if x.l.Aligned {
			perWindow := map[int64]int64{}
			for _, a := range adm {
				ws := windowStart(a.at, x.l.Window)
				perWindow[ws] += a.cost
				if perWindow[ws] > x.l.Limit {
					t.Fatalf("aligned window at %d admitted %d > %d", ws, perWindow[ws], x.l.Limit)
				}
			}
			return
		}
		// First-hit windows: any interval shorter than a window holds at
		// most 2*Limit, and the window opened by a first hit holds Limit.
		slidingMax(t, adm, x.l.Window, 2*x.l.Limit)
	case *logSubject:
		slidingMax(t, adm, x.l.Window, x.l.Limit)
	case *slidingSubject:
		perWindow := map[int64]int64{}
		for _, a := range adm {
			ws := windowStart(a.at, x.l.Window)
			perWindow[ws] += a.cost
			if perWindow[ws] > x.l.Limit {
				t.Fatalf("sliding counter: aligned window at %d admitted %d > %d", ws, perWindow[ws], x.l.Limit)
			}
		}
		slidingMax(t, adm, x.l.Window, 2*x.l.Limit)
	case *bucketSubject:
		// In every interval [a, b]: admitted*Period <= Burst*Period + (b-a)*Rate.
		rateBound(t, adm, x.l.Period, x.l.Rate, x.l.Burst*x.l.Period)
	case *gcraSubject:
		// In every interval [a, b]: admitted*T <= (MaxBurst+1)*T + (b-a).
		t0 := x.l.Interval()
		rateBound(t, adm, t0, 1, (x.l.MaxBurst+1)*t0)
	case *reserveSubject:
		// A refund moves the free ticket back: requests after it may
		// proceed before those it was refunded for.
		slices.SortStableFunc(adm, func(a, b admission) int { return cmp.Compare(a.at, b.at) })
		// Requests proceed (at now+Wait) no faster than the rate, after the
		// stored burst: the same bound as the token bucket, plus one request's
		// debt (pay later).
		rateBound(t, adm, x.l.Period, x.l.Rate, 2*x.l.Burst*x.l.Period)
	default:
		t.Fatalf("no bound for %s", name)
	}
}

// slidingMax checks that every half-open interval (t-w, t] admits at most max.
func slidingMax(t *testing.T, adm []admission, w, max int64) {
	t.Helper()
	var sum int64
	lo := 0
	for hi := range adm {
		sum += adm[hi].cost
		for adm[lo].at <= adm[hi].at-w {
			sum -= adm[lo].cost
			lo++
		}
		if sum > max {
			t.Fatalf("interval (%d, %d] admitted %d > %d", adm[hi].at-w, adm[hi].at, sum, max)
		}
	}
}

// rateBound checks cost(i..j)*unit <= burst + (t_j - t_i)*rate for every i <= j
// in O(n): with prefix sums, max over i of -(cum_{i-1}*unit - t_i*rate).
func rateBound(t *testing.T, adm []admission, unit, rate, burst int64) {
	t.Helper()
	var cum int64
	best := int64(1 << 62) // min over i of cum_{i-1}*unit - t_i*rate
	for _, a := range adm {
		best = min(best, cum*unit-a.at*rate)
		cum += a.cost
		if got := cum*unit - a.at*rate - best; got > burst {
			t.Fatalf("admitted too fast: excess %d > burst %d (unit %d, rate %d)", got, burst, unit, rate)
		}
	}
}
