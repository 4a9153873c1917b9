package precheck

import (
	"math/rand/v2"
	"testing"

	"github.com/sluicehq/sluice/algorithms"
)

// TestCurveDominatesGlobalLimit checks the arrival curves directly: a
// greedy client hammers a global limiter; every request it admits is fed, at
// the same time, to a token bucket with the curve's parameters, which must
// admit it too. With one token less the bucket must fail somewhere, so the
// curves are also tight (except the sliding window's rounding term).
func TestCurveDominatesGlobalLimit(t *testing.T) {
	for _, alg := range []algorithms.Kind{algorithms.KindFixedWindow, algorithms.KindSlidingWindow, algorithms.KindSlidingLog, algorithms.KindTokenBucket, algorithms.KindGCRA} {
		t.Run(alg.String(), func(t *testing.T) {
			tightFailures := 0
			for seed := 0; seed < 200; seed++ {
				rng := rand.New(rand.NewPCG(uint64(alg)+100, uint64(seed)))
				o := randomOracle(rng, alg)
				rate, period, burst, ok := curve(o.reported())
				if !ok {
					t.Fatalf("no curve for %+v", o.reported())
				}
				exact := algorithms.TokenBucket{Rate: rate, Period: period, Burst: burst}
				tight := algorithms.TokenBucket{Rate: rate, Period: period, Burst: burst - 1}
				var es, ts algorithms.TokenBucketState
				w := o.reported().Window
				tightOK := burst > 1
				for now := int64(0); now < 20*w; {
					cost := int64(1)
					if rng.IntN(5) == 0 {
						cost = 1 + rng.Int64N(o.capacity())
					}
					r, err := o.allow(now, cost)
					if err != nil {
						t.Fatal(err)
					}
					if r.Allowed {
						if er, err := exact.Allow(&es, now, cost); err != nil || !er.Allowed {
							t.Fatalf("seed %d: %+v admitted cost %d at %d, its curve %+v does not (%v)", seed, o.reported(), cost, now, exact, err)
						}
						if tightOK {
							if tr, err := tight.Allow(&ts, now, cost); err != nil || !tr.Allowed {
								tightFailures++
								tightOK = false
							}
						}
					}
					// Next arrival: mostly at once or just across a window
					// boundary, sometimes later.
					switch rng.IntN(4) {
					case 0:
					case 1:
						now = (now/w+1)*w - rng.Int64N(2)
					case 2:
						now = (now/w + 1) * w
					default:
						now += rng.Int64N(w / 4)
					}
				}
			}
			if alg != algorithms.KindSlidingWindow && tightFailures == 0 {
				t.Fatalf("the curve is never tight: one token less is always enough")
			}
			t.Logf("one token less fails in %d of 200 runs", tightFailures)
		})
	}
}

func TestLocalBucket(t *testing.T) {
	const second = int64(1e9)
	tests := []struct {
		name  string
		limit Limit
		delay int64
		want  algorithms.TokenBucket
		ok    bool
	}{
		// slack = ceil(2*(delay/1us + 1)*rate/period) + 1
		{"fixed", Limit{algorithms.KindFixedWindow, 100, 60 * second, 0}, 20 * ms, algorithms.TokenBucket{Rate: 100, Period: 60e6, Burst: 200 + 1 + 1}, true},
		{"sliding window", Limit{algorithms.KindSlidingWindow, 3000, second, 0}, 20 * ms, algorithms.TokenBucket{Rate: 3000, Period: 1e6, Burst: 3003 + 121 + 1}, true},
		{"sliding log", Limit{algorithms.KindSlidingLog, 10, second, 0}, 0, algorithms.TokenBucket{Rate: 10, Period: 1e6, Burst: 10 + 1 + 1}, true},
		{"token bucket", Limit{algorithms.KindTokenBucket, 5, second, 50}, 20 * ms, algorithms.TokenBucket{Rate: 5, Period: 1e6, Burst: 50 + 1 + 1}, true},
		{"gcra", Limit{algorithms.KindGCRA, 10, second, 5}, 20 * ms, algorithms.TokenBucket{Rate: 1, Period: 99999, Burst: 5 + 1 + 1}, true},
		{"gcra without capacity", Limit{algorithms.KindGCRA, 10, second, 0}, 20 * ms, algorithms.TokenBucket{}, false},
		{"reserve", Limit{algorithms.KindReserve, 10, second, 4}, 20 * ms, algorithms.TokenBucket{}, false},
		{"unknown", Limit{algorithms.KindUnknown, 10, second, 4}, 20 * ms, algorithms.TokenBucket{}, false},
		{"token bucket without burst", Limit{algorithms.KindTokenBucket, 5, second, 0}, 20 * ms, algorithms.TokenBucket{}, false},
		{"zero limit", Limit{algorithms.KindFixedWindow, 0, second, 0}, 20 * ms, algorithms.TokenBucket{}, false},
		{"sub-microsecond window", Limit{algorithms.KindFixedWindow, 1, 999, 0}, 20 * ms, algorithms.TokenBucket{}, false},
		{"gcra interval under 1us", Limit{algorithms.KindGCRA, 1000, 1000 * 1500, 1}, 0, algorithms.TokenBucket{}, false},
		{"huge limit", Limit{algorithms.KindFixedWindow, 1 << 50, second, 0}, 0, algorithms.TokenBucket{}, false},
		{"negative delay", Limit{algorithms.KindFixedWindow, 1, second, 0}, -1, algorithms.TokenBucket{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := localBucket(tt.limit, tt.delay)
			if ok != tt.ok || (ok && got != tt.want) {
				t.Fatalf("localBucket(%+v, %d) = %+v, %v; want %+v, %v", tt.limit, tt.delay, got, ok, tt.want, tt.ok)
			}
		})
	}
}

// TestPeekMatchesAllow holds peek to algorithms.TokenBucket.Allow on a
// copy of the state, over random valid buckets, states (including more used
// than the capacity, after a lowered limit), times and costs.
func TestPeekMatchesAllow(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	rejected, admitted := 0, 0
	for i := 0; i < 200000; i++ {
		b, s, now, cost, valid := randomBucketCase(rng)
		if !valid {
			continue
		}
		c := s
		r, err := b.Allow(&c, now, cost)
		retry, ok := peek(&b, &s, now, cost)
		if wantOK := err != nil || r.Allowed; ok != wantOK || (!ok && retry != r.RetryAfter) {
			t.Fatalf("%+v %+v now %d cost %d: peek %d, %v; Allow %+v, %v", b, s, now, cost, retry, ok, r, err)
		}
		if ok {
			admitted++
		} else {
			rejected++
		}
	}
	if rejected < 10000 || admitted < 10000 {
		t.Fatalf("unbalanced cases: %d rejected, %d admitted", rejected, admitted)
	}
}

// randomBucketCase draws a token bucket (false when it is not valid), a
// state of it (more used than the capacity too, as after a lowered limit),
// a time (earlier than the state's too) and a cost (invalid ones too), for
// the tests that hold peek and take to algorithms.TokenBucket.Allow.
func randomBucketCase(rng *rand.Rand) (b algorithms.TokenBucket, s algorithms.TokenBucketState, now, cost int64, valid bool) {
	b = algorithms.TokenBucket{Rate: 1 + rng.Int64N(1000), Period: 1 + rng.Int64N(1e9), Burst: 1 + rng.Int64N(1000)}
	if rng.IntN(4) == 0 {
		b.Rate = 1 + rng.Int64N(1e12)
	}
	if b.Validate() != nil {
		return b, s, 0, 0, false
	}
	capacity := b.Burst * b.Period
	s = algorithms.TokenBucketState{Last: rng.Int64N(1e12), Used: rng.Int64N(capacity + capacity/4 + 1)}
	now = s.Last + rng.Int64N(2e9) - 1e8
	cost = rng.Int64N(b.Burst+2) - 1
	return b, s, now, cost, true
}
