package lease

import (
	"math"
	"testing"
	"time"
)

func TestSize(t *testing.T) {
	p := Policy{Target: 100 * time.Millisecond, Max: 1000}
	for _, tt := range []struct {
		name string
		d    Demand
		want int64
	}{
		{"unknown remaining: per request", Demand{Rate: 1000, Remaining: -1, Replicas: 1, Capacity: 10000}, 1},
		{"no rate yet: per request", Demand{Rate: 0, Remaining: 5000, Replicas: 1, Capacity: 10000}, 1},
		{"NaN rate", Demand{Rate: math.NaN(), Remaining: 5000, Replicas: 1, Capacity: 10000}, 1},
		{"target at the rate", Demand{Rate: 1000, Remaining: 5000, Replicas: 1, Capacity: 10000}, 100},
		{"rounds up", Demand{Rate: 15, Remaining: 5000, Replicas: 1, Capacity: 10000}, 2},
		{"max", Demand{Rate: 1e6, Remaining: 1e6, Replicas: 1, Capacity: 1e7}, 1000},
		{"infinite rate", Demand{Rate: math.Inf(1), Remaining: 1e6, Replicas: 1, Capacity: 1e7}, 1000},
		{"capacity", Demand{Rate: 1e6, Remaining: 1e6, Replicas: 1, Capacity: 50}, 50},
		{"remaining over replicas", Demand{Rate: 1000, Remaining: 120, Replicas: 3, Capacity: 10000}, 40},
		{"near the limit: 1", Demand{Rate: 1000, Remaining: 5, Replicas: 3, Capacity: 10000}, 1},
		{"at the limit: 1", Demand{Rate: 1000, Remaining: 0, Replicas: 3, Capacity: 10000}, 1},
		{"replicas 0 counts as 1", Demand{Rate: 1000, Remaining: 70, Replicas: 0, Capacity: 10000}, 70},
	} {
		if got := p.Size(tt.d); got != tt.want {
			t.Errorf("%s: Size(%+v) = %d, want %d", tt.name, tt.d, got, tt.want)
		}
	}
}

// TestSizeShrinks: as a budget is spent by leases of the size Size gives,
// each lease is at most a replica's share of the remaining budget, and the
// last ones are 1 (per request).
func TestSizeShrinks(t *testing.T) {
	p := Policy{Target: time.Second, Max: 1000}
	remaining := int64(1000)
	var sizes []int64
	for remaining > 0 {
		k := p.Size(Demand{Rate: 1e4, Remaining: remaining, Replicas: 2, Capacity: 1000})
		if k > 1 && k > remaining/2 {
			t.Fatalf("lease %d with %d remaining among 2 replicas", k, remaining)
		}
		sizes = append(sizes, k)
		remaining -= k
	}
	if sizes[len(sizes)-1] != 1 || sizes[0] != 500 {
		t.Fatalf("sizes %v: want 500 first and 1 last", sizes)
	}
}

func TestMeter(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var m meter
	if r := m.perSecond(t0); r != 0 {
		t.Fatalf("empty meter: %v", r)
	}
	// Before a period ends: one use is no rate; a burst of three is three
	// per tau (not three per microsecond).
	m.add(t0, 1)
	if r := m.perSecond(t0.Add(time.Microsecond)); r != 0 {
		t.Fatalf("one use: %v", r)
	}
	m.add(t0.Add(time.Microsecond), 2)
	if r := m.perSecond(t0.Add(2 * time.Microsecond)); r != 3/tau.Seconds() {
		t.Fatalf("a burst of 3: %v, want %v", r, 3/tau.Seconds())
	}
	m = meter{}
	// 1000 per second for a second, one unit a millisecond.
	for i := range 1000 {
		m.add(t0.Add(time.Duration(i)*time.Millisecond), 1)
	}
	if r := m.perSecond(t0.Add(time.Second)); r < 900 || r > 1100 {
		t.Fatalf("rate %v, want about 1000", r)
	}
	// Then 100 per second for two seconds: the average follows.
	t1 := t0.Add(time.Second)
	for i := range 200 {
		m.add(t1.Add(time.Duration(i)*10*time.Millisecond), 1)
	}
	if r := m.perSecond(t1.Add(2 * time.Second)); r < 80 || r > 130 {
		t.Fatalf("rate %v, want about 100", r)
	}
	// Idle for 10 s: the estimate falls.
	if r := m.perSecond(t1.Add(12 * time.Second)); r > 10 {
		t.Fatalf("rate after 10 s idle %v", r)
	}
}
