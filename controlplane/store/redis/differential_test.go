package redisstore

import (
	"context"
	"fmt"
	"math/rand"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/calendar"
	"github.com/sluicehq/sluice/controlplane/store"
)

// differential drives keys limits of alg through the store (the scripts, with
// injected time) and through package algorithms on the same microsecond
// numbers, rounds times, and fails on the first results that differ. Each
// round steps the clock once and decides every key in one Decide (one script
// call per hash slot). With changeLimits, limits change under existing state
// every few rounds, as a policy update does. With shared, every key has the
// same limit and each round the same cost, as under a load of one descriptor
// (the script's inline path for fixed_window, see dispatch.lua); each round
// then decides a random half of the keys, so that their states differ.
//
// With modes, checks are also probes and charges (see randomMode).
func differential(t *testing.T, client redis.UniversalClient, alg algorithms.Kind, keys, rounds int, changeLimits, shared, modes bool, seed int64) {
	t.Helper()
	differentialWith(t, client, alg, keys, rounds, diffOptions{changeLimits: changeLimits, shared: shared, modes: modes}, seed)
}

// diffOptions say what differentialWith varies besides times and costs.
type diffOptions struct {
	changeLimits bool // limits change under existing state, as a policy update does
	shared       bool // one limit and cost for every key of a round
	modes        bool // probes, charges and refunds besides requests
	once         bool // Once tokens on half the charges and refunds
	calendar     bool // calendar limits, on a clock that crosses months' ends and daylight-saving changes
}

// onceTTL is the dedupe TTL of differentialWith: shorter than the longest
// clock steps, so that tokens are forgotten too (three days on the calendar
// clock, whose steps are longer).
const onceTTL = 20 * time.Minute

// differentialWith is differential with the options o; with o.once, half
// the charges and refunds carry a store.Once token drawn from a few per
// key, so that many are duplicates (and some come back after onceTTL),
// against an oracle that applies a token's first use within the TTL and
// answers a probe after it; with o.calendar, the limits are calendar ones,
// on a clock from March 1st, 2026 over four months.
func differentialWith(t *testing.T, client redis.UniversalClient, alg algorithms.Kind, keys, rounds int, o diffOptions, seed int64) {
	t.Helper()
	changeLimits, shared, modes, once := o.changeLimits, o.shared, o.modes, o.once
	rng := rand.New(rand.NewSource(seed))
	clk := newClock(1_700_000_000_000_000 + rng.Int63n(1_000_000_000_000))
	randomLimit, randomStep, ttl := randomLimit, randomStep, onceTTL
	if o.calendar {
		clk = newClock(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC).UnixMicro())
		randomLimit, randomStep, ttl = randomCalendarLimit, randomCalendarStep, 72*time.Hour
	}
	s := newStore(t, client, Options{MaxBatch: keys, Now: clk.Now, OnceTTL: ttl})
	applied := make([]map[string]int64, keys) // per key: token -> when it is forgotten (us)
	var dups, charged int
	const maxRequests = 1000
	checks := make([]store.Check, keys)
	oracles := make([]*oracle, keys)
	l := randomLimit(rng, alg, maxRequests, 1)
	for i := range checks {
		if !shared {
			l = randomLimit(rng, alg, maxRequests, 1)
		}
		checks[i] = store.Check{Key: store.Key("differential", []store.Entry{{Key: "k", Value: strconv.Itoa(i)}}, strconv.FormatInt(seed, 10), alg), Limit: l}
		oracles[i] = newOracle(l, time.Microsecond, maxRequests)
	}
	out := make([]algorithms.Result, keys)
	var round []store.Check // this round's checks, of keys idx
	var idx []int
	// The sorted set of sliding_log orders entries by time, the Go ring by
	// arrival: they agree while the clock does not step back (see
	// sliding_log.lua), so only the other algorithms see it step back.
	back := alg != algorithms.KindSlidingLog
	var allowed, denied, waited int
	for r := range rounds {
		clk.add(randomStep(rng, back))
		if shared {
			if changeLimits && rng.Intn(8) == 0 {
				l = randomLimit(rng, alg, maxRequests, 1)
			}
			mode, cost := store.Take, randomCost(rng, l)
			if modes {
				mode, cost = randomMode(rng, l)
			}
			for i := range checks {
				checks[i].Limit, checks[i].Cost, checks[i].Mode = l, cost, mode
				oracles[i].l = l
			}
			tok := onceToken(rng, once && (mode == store.Charge || mode == store.Refund))
			for i := range checks {
				checks[i].Once = nil
				if tok != "" {
					checks[i].Once = &store.Once{Token: tok}
				}
			}
		} else {
			for i := range checks {
				if changeLimits && rng.Intn(8) == 0 {
					checks[i].Limit = randomLimit(rng, alg, maxRequests, 1)
					oracles[i].l = checks[i].Limit
				}
				checks[i].Cost = randomCost(rng, checks[i].Limit)
				if modes {
					checks[i].Mode, checks[i].Cost = randomMode(rng, checks[i].Limit)
				}
				checks[i].Once = nil
				if tok := onceToken(rng, once && (checks[i].Mode == store.Charge || checks[i].Mode == store.Refund)); tok != "" {
					checks[i].Once = &store.Once{Token: tok}
				}
			}
		}
		round, idx = round[:0], idx[:0]
		for i := range checks {
			if !shared || rng.Intn(2) == 0 {
				round, idx = append(round, checks[i]), append(idx, i)
			}
		}
		if len(round) == 0 {
			continue
		}
		if err := s.Decide(context.Background(), round, out[:len(round)]); err != nil {
			t.Fatalf("round %d: %v", r, err)
		}
		for k, c := range round {
			i := idx[k]
			var want algorithms.Result
			var err error
			if c.Once != nil {
				want, err = onceOracle(oracles[i], &applied[i], clk.get(), ttl, c)
				if c.Once.Duplicate {
					dups++
				} else {
					charged++
				}
			} else {
				want, err = oracles[i].decide(clk.get(), c.Cost, c.Mode)
			}
			if err != nil {
				t.Fatalf("round %d key %d: Go: %v", r, i, err)
			}
			if want.Remaining < 0 {
				t.Fatalf("round %d key %d, limit %+v, now %d us, cost %d: package algorithms answered Remaining %d, "+
					"which its Result contract forbids (the script answers 0): the Go %s must clamp it at 0",
					r, i, c.Limit, clk.get(), c.Cost, want.Remaining, alg)
			}
			if diff := sameResult(out[k], want); diff != "" {
				t.Fatalf("round %d key %d, limit %+v, now %d us, cost %d, mode %v:\n%s", r, i, c.Limit, clk.get(), c.Cost, c.Mode, diff)
			}
			if want.Allowed {
				allowed++
				if want.Wait > 0 {
					waited++
				}
			} else {
				denied++
			}
		}
	}
	// Both outcomes must be well represented, or the comparison proves little.
	steps := allowed + denied
	if allowed < steps/10 || denied < steps/10 {
		t.Fatalf("allowed %d, denied %d of %d: the random steps do not exercise both outcomes", allowed, denied, steps)
	}
	if alg == algorithms.KindReserve && !shared && waited < steps/100 { // shared rounds change the limit too often to queue much
		t.Fatalf("%d of %d allowed reservations waited: the random steps do not exercise waiting", waited, allowed)
	}
	if once && (dups < steps/200 || charged < steps/200) {
		t.Fatalf("%d duplicates, %d once-charges applied of %d steps: the random steps do not exercise both", dups, charged, steps)
	}
	t.Logf("%d steps: %d allowed (%d waited), %d denied", steps, allowed, waited, denied)
	if once {
		t.Logf("once: %d charges applied, %d duplicates", charged, dups)
	}
}

// onceToken returns "" (no token) unless on, then half the time a token of
// four per key.
func onceToken(rng *rand.Rand, on bool) string {
	if !on || rng.Intn(2) == 0 {
		return ""
	}
	return "t" + strconv.Itoa(rng.Intn(4))
}

// onceOracle decides c, a charge or refund with a Once, on o at now (us),
// with applied the key's tokens: the charge or refund unless the token was
// applied within ttl, then a probe. It fails when the store's Duplicate
// disagrees.
func onceOracle(o *oracle, applied *map[string]int64, now int64, ttl time.Duration, c store.Check) (algorithms.Result, error) {
	if *applied == nil {
		*applied = map[string]int64{}
	}
	exp, seen := (*applied)[c.Once.Token]
	dup := seen && exp > now
	if dup != c.Once.Duplicate {
		return algorithms.Result{}, fmt.Errorf("token %s at %d us (remembered until %d, %v): store says duplicate=%v", c.Once.Token, now, exp, seen, c.Once.Duplicate)
	}
	if !dup {
		(*applied)[c.Once.Token] = now + ttl.Microseconds()
		if _, err := o.decide(now, c.Cost, c.Mode); err != nil {
			return algorithms.Result{}, err
		}
	}
	return o.decide(now, 0, store.Probe)
}

// TestDifferential: for every algorithm, 12,000 random (time, cost, limit)
// steps give identical Allowed, Limit, Remaining, RetryAfter and ResetAfter
// in the scripts and in package algorithms.
func TestDifferential(t *testing.T) {
	_, client := startClient(t)
	for i, alg := range algs {
		t.Run(alg.String(), func(t *testing.T) {
			differential(t, client, alg, 200, 60, false, false, false, int64(100+i))
		})
	}
}

// TestDifferentialLimitChanges is TestDifferential with limits that change
// under existing state (a policy update keeps the keys).
func TestDifferentialLimitChanges(t *testing.T) {
	_, client := startClient(t)
	for i, alg := range algs {
		t.Run(alg.String(), func(t *testing.T) {
			differential(t, client, alg, 200, 50, true, false, false, int64(200+i))
		})
	}
}

// TestDifferentialShared is TestDifferential (about 12,000 steps) with one
// limit and one cost for every key of a round, and limits that change under
// existing state: each script call then takes its one-limit path, inline for
// fixed_window.
func TestDifferentialShared(t *testing.T) {
	_, client := startClient(t)
	for i, alg := range algs {
		t.Run(alg.String(), func(t *testing.T) {
			differential(t, client, alg, 200, 120, true, true, false, int64(500+i))
		})
	}
}

// TestDifferentialUsage is TestDifferential and TestDifferentialShared with
// probes and charges among the checks (charges past the limit and past the
// debt ceiling included), and limits that change under existing state: the
// scripts and package algorithms agree on what each algorithm does in debt.
func TestDifferentialUsage(t *testing.T) {
	_, client := startClient(t)
	for i, alg := range algs {
		t.Run(alg.String(), func(t *testing.T) {
			differential(t, client, alg, 200, 60, true, false, true, int64(700+i))
		})
		t.Run(alg.String()+"/shared", func(t *testing.T) {
			differential(t, client, alg, 200, 120, true, true, true, int64(800+i))
		})
	}
}

// TestDifferentialOnce is TestDifferentialUsage with Once tokens on half
// the charges, many of them duplicates: a token charges once within the
// TTL and every once-check answers a probe after it, in the scripts as in
// package algorithms with a map of tokens.
func TestDifferentialOnce(t *testing.T) {
	_, client := startClient(t)
	for i, alg := range algs {
		t.Run(alg.String(), func(t *testing.T) {
			differentialWith(t, client, alg, 200, 60, diffOptions{changeLimits: true, modes: true, once: true}, int64(900+i))
		})
		t.Run(alg.String()+"/shared", func(t *testing.T) {
			differentialWith(t, client, alg, 200, 120, diffOptions{changeLimits: true, shared: true, modes: true, once: true}, int64(1000+i))
		})
	}
}

// TestDifferentialCalendar is TestDifferentialOnce on calendar limits (days,
// ISO weeks, months, years in Berlin and New York) for every algorithm with
// windows, on a clock that goes from March 1st, 2026 through four months:
// months' ends, and the daylight-saving changes of both zones, in the
// scripts as in package algorithms given the same periods.
func TestDifferentialCalendar(t *testing.T) {
	_, client := startClient(t)
	for i, alg := range []algorithms.Kind{algorithms.KindFixedWindow, algorithms.KindSlidingWindow, algorithms.KindSlidingLog} {
		t.Run(alg.String(), func(t *testing.T) {
			differentialWith(t, client, alg, 100, 120, diffOptions{changeLimits: true, modes: true, once: true, calendar: true}, int64(1100+i))
		})
		t.Run(alg.String()+"/shared", func(t *testing.T) {
			differentialWith(t, client, alg, 100, 120, diffOptions{changeLimits: true, shared: true, modes: true, calendar: true}, int64(1200+i))
		})
	}
}

// randomCalendarLimit returns a random calendar limit of alg (minWindow is
// not used): a unit of day, week, month or year (sliding_window: not year,
// whose periods its Lua arithmetic refuses) in Berlin or New York.
func randomCalendarLimit(rng *rand.Rand, alg algorithms.Kind, maxRequests, _ int64) store.Limit {
	zone := []string{"Europe/Berlin", "America/New_York"}[rng.Intn(2)]
	units := []algorithms.Unit{algorithms.UnitDay, algorithms.UnitWeek, algorithms.UnitMonth, algorithms.UnitYear}
	if alg == algorithms.KindSlidingWindow {
		units = units[:3]
	}
	unit := units[rng.Intn(len(units))]
	cal, err := calendar.Of(zone, unit)
	if err != nil {
		panic(err)
	}
	nominal := map[algorithms.Unit]time.Duration{algorithms.UnitDay: 24 * time.Hour, algorithms.UnitWeek: 7 * 24 * time.Hour,
		algorithms.UnitMonth: 30 * 24 * time.Hour, algorithms.UnitYear: 365 * 24 * time.Hour}[unit]
	return store.Limit{Algorithm: alg, Requests: logUniform(rng, 1, maxRequests), Window: nominal, Calendar: cal}
}

// randomCalendarStep returns a clock step in microseconds of about a day on
// average: often none, some within a period, a few of a week or more, and
// backward (when back is set) by up to an hour.
func randomCalendarStep(rng *rand.Rand, back bool) int64 {
	const hour = int64(time.Hour / time.Microsecond)
	switch r := rng.Intn(100); {
	case r < 20:
		return 0
	case r < 30 && back:
		return -logUniform(rng, 1, hour)
	case r < 50:
		return logUniform(rng, 1, hour)
	case r < 92:
		return rng.Int63n(48 * hour)
	default:
		return 5*24*hour + rng.Int63n(5*24*hour)
	}
}

// roundUpMicro rounds a nanosecond duration up to a whole microsecond.
func roundUpMicro(ns int64) int64 {
	return (ns + 999) / 1000 * 1000
}

// TestRoundingRule states and checks how the store's results (the scripts
// on microseconds, times 1000) relate to the Go algorithms run on
// nanoseconds, for inputs on whole microseconds:
//
//   - fixed_window, sliding_log: identical.
//   - token_bucket, sliding_window: identical Allowed, Limit and Remaining;
//     RetryAfter and ResetAfter are the Go ones rounded up to a whole
//     microsecond (token_bucket divides by the rate, sliding_window's
//     retry-after finds the first instant the weight allows, and both round
//     up, to the unit they run on).
//   - gcra: identical when the period in microseconds is a multiple of
//     count. Otherwise the emission interval is rounded down to a microsecond
//     instead of a nanosecond, and the results differ (checked to happen).
//   - reserve: identical when the period in microseconds is a multiple of
//     the rate: every state is then a multiple of the rate, so each slot is
//     a whole number of microseconds. Otherwise slots are rounded up to a
//     microsecond instead of a nanosecond, and the results differ (checked
//     to happen).
func TestRoundingRule(t *testing.T) {
	_, client := startClient(t)
	const keys, rounds, maxRequests = 100, 40, 200
	for ai, alg := range algs {
		t.Run(alg.String(), func(t *testing.T) {
			rng := rand.New(rand.NewSource(int64(300 + ai)))
			clk := newClock(1_700_000_000_000_000)
			s := newStore(t, client, Options{MaxBatch: keys, Now: clk.Now})
			checks := make([]store.Check, keys)
			oracles := make([]*oracle, keys)
			divisible := make([]bool, keys)
			for i := range checks {
				l := randomLimit(rng, alg, maxRequests, 1)
				w := int64(l.Window / time.Microsecond)
				if (alg == algorithms.KindGCRA || alg == algorithms.KindReserve) && i%2 == 0 { // half with period a multiple of count
					w = max(w/l.Requests, 1) * l.Requests
					l.Window = micros(w)
				}
				divisible[i] = w%l.Requests == 0
				checks[i] = store.Check{Key: store.Key("rounding", []store.Entry{{Key: "k", Value: strconv.Itoa(i)}}, "", alg), Limit: l}
				oracles[i] = newOracle(l, time.Nanosecond, maxRequests)
			}
			out := make([]algorithms.Result, keys)
			var differ int
			for r := range rounds {
				clk.add(randomStep(rng, alg != algorithms.KindSlidingLog))
				for i := range checks {
					checks[i].Cost = randomCost(rng, checks[i].Limit)
				}
				if err := s.Decide(context.Background(), checks, out); err != nil {
					t.Fatal(err)
				}
				for i, c := range checks {
					goNs, err := oracles[i].allow(clk.get()*1000, c.Cost)
					if err != nil {
						t.Fatal(err)
					}
					got := out[i]
					want := goNs
					switch alg {
					case algorithms.KindTokenBucket, algorithms.KindSlidingWindow:
						want.RetryAfter = roundUpMicro(want.RetryAfter)
						want.ResetAfter = roundUpMicro(want.ResetAfter)
					case algorithms.KindGCRA, algorithms.KindReserve:
						if !divisible[i] {
							// Different emission intervals: count the
							// differences, compare nothing else.
							if got != want {
								differ++
							}
							continue
						}
					}
					if got != want {
						t.Fatalf("round %d key %d, limit %+v, now %d us, cost %d:\nstore %+v\nGo ns %+v (rule applied)", r, i, c.Limit, clk.get(), c.Cost, got, want)
					}
				}
			}
			if (alg == algorithms.KindGCRA || alg == algorithms.KindReserve) && differ == 0 {
				t.Fatal(alg.String() + " with period not a multiple of count never differed from Go on nanoseconds: the stated rule is wrong")
			}
		})
	}
}
