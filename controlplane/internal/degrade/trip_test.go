package degrade

import (
	"strings"
	"testing"
	"time"
)

// attempt is one primary attempt on synthetic time: started at start ms,
// ended (seen) at end ms.
type attempt struct {
	start, end int
	ok         bool
}

// TestTripperTable feeds attempts to a tripper, in order, and checks after
// which one (1-based) it says to switch; 0: never.
func TestTripperTable(t *testing.T) {
	ok := func(at int) attempt { return attempt{at, at + 1, true} }
	late := func(start int) attempt { return attempt{start, start + 20, false} } // missed a 20 ms deadline
	many := func(n int, f func(i int) attempt) []attempt {
		var a []attempt
		for i := range n {
			a = append(a, f(i))
		}
		return a
	}
	cat := func(parts ...[]attempt) []attempt {
		var a []attempt
		for _, p := range parts {
			a = append(a, p...)
		}
		return a
	}
	tests := []struct {
		name     string
		trip     Trip
		attempts []attempt
		want     int
	}{
		{"one late call", Trip{}, []attempt{ok(0), late(10), ok(40)}, 0},
		{"one late call, first ever", Trip{}, []attempt{late(0)}, 0},
		// 64 calls waiting on one stalled round trip fail together: one failure.
		{"one stall under load", Trip{}, cat(many(100, func(i int) attempt { return ok(i / 10) }),
			many(64, func(i int) attempt { return attempt{100 + i/4, 125 + i/4, false} }),
			many(100, func(i int) attempt { return ok(150 + i) })), 0},
		{"a stall of four deadlines", Trip{}, many(64, func(i int) attempt { return late(i * 80 / 64) }), 0},
		{"a stall of 350 ms, Failures off", Trip{Failures: 1000}, many(350, func(i int) attempt { return late(i) }), 0},
		{"a stall of five deadlines", Trip{}, []attempt{late(0), late(20), late(40), late(60), late(80)}, 5},
		{"five quick errors", Trip{}, many(5, func(i int) attempt { return attempt{i, i, false} }), 5},
		{"four errors, a success, four errors", Trip{}, cat(many(4, func(i int) attempt { return attempt{i, i, false} }),
			[]attempt{ok(4)}, many(4, func(i int) attempt { return attempt{5 + i, 5 + i, false} })), 0},
		{"Failures 1 switches at once", Trip{Failures: 1}, []attempt{ok(0), late(1)}, 2},
		// Every other call fails, never two in a row: the ratio (1/2 over
		// 1 s, at least 20 calls) decides.
		// (failures seen in 5 tenths of the window from attempt 42 on).
		{"half failing", Trip{}, many(100, func(i int) attempt { return attempt{i * 10, i*10 + 1, i%2 == 0} }), 42},
		{"half failing, ratio off", Trip{Ratio: 2}, many(100, func(i int) attempt { return attempt{i * 10, i*10 + 1, i%2 == 0} }), 0},
		{"a third failing", Trip{}, many(90, func(i int) attempt { return attempt{i * 10, i*10 + 1, i%3 != 0} }), 0},
		// Ten failures an hour apart, the rest ok: never half of a window.
		{"failures spread out", Trip{Ratio: 0.5, Window: 100 * time.Millisecond}, many(60, func(i int) attempt {
			return attempt{i * 10, i*10 + 1, i%6 != 0}
		}), 0},
		// The window forgets: 30 failures one second, successes after;
		// the ratio would trip, so turn the run off with Failures.
		{"old failures leave the window", Trip{Failures: 1000, Ratio: 0.5, Window: time.Second}, cat(
			many(30, func(i int) attempt { return attempt{i, i + 1, true} }),
			many(10, func(i int) attempt { return attempt{2000 + i, 2001 + i, false} }),
		), 0},
		{"ratio over few calls does not count", Trip{Failures: 1000}, many(19, func(i int) attempt { return attempt{i * 50, i*50 + 1, false} }), 0},
		{"ratio over 20 calls counts", Trip{Failures: 1000}, many(21, func(i int) attempt { return attempt{i * 50, i*50 + 1, false} }), 20},
	}
	base := time.Unix(1_800_000_000, 0)
	ms := func(n int) time.Time { return base.Add(time.Duration(n) * time.Millisecond) }
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			trip, err := tt.trip.withDefaults()
			if err != nil {
				t.Fatal(err)
			}
			p := newTripper(trip)
			got := 0
			for i, a := range tt.attempts {
				if a.ok {
					p.success(ms(a.start))
					continue
				}
				if p.failure(ms(a.start), ms(a.end)) {
					got = i + 1
					break
				}
			}
			if got != tt.want {
				t.Errorf("switched after attempt %d, want %d (0: never)", got, tt.want)
			}
		})
	}
}

// TestTripValidates checks that bad Trip settings are refused by New.
func TestTripValidates(t *testing.T) {
	for _, tt := range []struct {
		trip Trip
		want string
	}{
		{Trip{Failures: -1}, "Failures must not be negative"},
		{Trip{Ratio: -0.5}, "Ratio must be a fraction"},
		{Trip{Window: -time.Second}, "Window must not be negative"},
	} {
		_, err := New(newFake("a", 1), newFake("b", 2), Options{Probe: (&probeSwitch{}).probe, Trip: tt.trip})
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%+v: error %v, want %q", tt.trip, err, tt.want)
		}
	}
}

// TestStoreTripsOnSustainedFailure drives a Store with the default Trip on
// an injected clock: one failing call is answered by the fallback without
// a switch; five in a row switch; a probe that succeeds switches back and
// forgets the failures.
func TestStoreTripsOnSustainedFailure(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	s, primary, _, probe := setup(t, Options{Trip: Trip{Failures: DefaultTripFailures}, Now: func() time.Time {
		now = now.Add(time.Millisecond) // every clock read moves time on: attempts never overlap
		return now
	}})
	primary.mode.Store(fail)
	if got := from(t, s); got != "fallback" || s.Degraded() {
		t.Fatalf("one failure: answered by %s, degraded %v; want fallback, not degraded", got, s.Degraded())
	}
	primary.mode.Store(answer)
	if got := from(t, s); got != "primary" {
		t.Fatalf("after one failure, answered by %s", got)
	}
	primary.mode.Store(fail)
	for i := range DefaultTripFailures {
		if got := from(t, s); got != "fallback" || s.Degraded() != (i == DefaultTripFailures-1) {
			t.Fatalf("failure %d: answered by %s, degraded %v", i+1, got, s.Degraded())
		}
	}
	if n := value(t, s.Metrics().Transitions.WithLabelValues("fallback")); n != 1 {
		t.Fatalf("%v switches to the fallback, want 1", n)
	}
	probe.ok.Store(true)
	primary.mode.Store(answer)
	if !s.ProbeOnce(t.Context()) || s.Degraded() {
		t.Fatal("a good probe did not switch back")
	}
	primary.mode.Store(fail)
	if got := from(t, s); got != "fallback" || s.Degraded() {
		t.Fatalf("first failure after the return: answered by %s, degraded %v", got, s.Degraded())
	}
}
