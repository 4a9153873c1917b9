package rls

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/controlplane/store/memory"
)

func TestNearHits(t *testing.T) {
	for _, c := range []struct {
		ratio                     float64
		capacity, cost, remaining int64
		want                      int64
	}{
		{0.8, 10, 1, 9, 0},  // used 1
		{0.8, 10, 1, 2, 0},  // used 8: at the threshold, not past it
		{0.8, 10, 1, 1, 1},  // used 9
		{0.8, 10, 1, 0, 1},  // used 10
		{0.8, 10, 5, 0, 2},  // used 5 -> 10: two of the five past 8
		{0.8, 10, 3, 1, 1},  // used 6 -> 9
		{0.8, 10, 3, 0, 2},  // used 7 -> 10
		{0.5, 3, 1, 1, 1},   // threshold 1 (1.5 truncated, as envoyproxy/ratelimit's floor)
		{1, 10, 1, 0, 0},    // ratio 1: nothing is near
		{0.8, 10, 1, -3, 1}, // a negative remaining counts as none
	} {
		if got := nearHits(c.ratio, c.capacity, c.cost, c.remaining); got != c.want {
			t.Errorf("nearHits(%v, cap %d, cost %d, remaining %d) = %d, want %d", c.ratio, c.capacity, c.cost, c.remaining, got, c.want)
		}
	}
}

const statsPolicy = `
domain: stats
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: tenant
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5}
`

// ruleValue reads one rule counter.
func ruleValue(t *testing.T, v *prometheus.CounterVec, rule string) float64 {
	t.Helper()
	var m dto.Metric
	if err := v.WithLabelValues("stats", rule).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// series counts the label sets of a counter vector.
func series(v *prometheus.CounterVec) int {
	ch := make(chan prometheus.Metric, 1024)
	v.Collect(ch)
	close(ch)
	return len(ch)
}

// TestRuleMetrics checks envoyproxy/ratelimit's per-rule statistics on a
// 10/minute rule: 12 requests and one of cost 3 give total 15, within 10,
// near 2 (the 9th and 10th of 10 at the default ratio 0.8), over 5.
func TestRuleMetrics(t *testing.T) {
	c := &clock{}
	c.ns.Store(epoch.UnixNano())
	reg := prometheus.NewRegistry()
	svc, err := New(memory.New(memory.Options{Now: c.Now}), parse(t, statsPolicy), Options{Logger: quiet, Registerer: reg, MaxRuleValues: 3})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{svc: svc, clock: c, reg: reg}
	for range 12 {
		f.call(t, req("stats", desc("user=alice")))
	}
	costly := desc("user=alice")
	costly.HitsAddend = wrapperspb.UInt64(3)
	f.call(t, req("stats", costly))
	r := svc.rules
	for _, w := range []struct {
		name string
		vec  *prometheus.CounterVec
		want float64
	}{{"total_hits", r.totalHits, 15}, {"within_limit", r.withinLimit, 10}, {"near_limit", r.nearLimit, 2},
		{"over_limit", r.overLimit, 5}, {"shadow_mode", r.shadowMode, 0}} {
		if got := ruleValue(t, w.vec, "user#0"); got != w.want {
			t.Errorf("%s{rule=user#0} = %v, want %v", w.name, got, w.want)
		}
	}

	// A shadow rule answers OK and counts what it would have refused.
	for range 3 {
		if resp := f.call(t, req("stats", desc("shadow=x"))); resp.OverallCode != ok {
			t.Fatalf("shadow rule answered %v", resp.OverallCode)
		}
	}
	if got := ruleValue(t, r.shadowMode, "shadow#0"); got != 1 {
		t.Errorf("shadow_mode = %v, want 1", got)
	}
	if got := ruleValue(t, r.overLimit, "shadow#0"); got != 1 {
		t.Errorf("over_limit of the shadow rule = %v, want 1", got)
	}

	// A detailed rule labels each value, up to MaxRuleValues (3); the rest
	// share one label.
	for i := range 5 {
		f.call(t, req("stats", desc(fmt.Sprintf("tenant=t%d", i))))
	}
	for _, rule := range []string{"tenant#0@tenant=t0", "tenant#0@tenant=t1", "tenant#0@tenant=t2"} {
		if got := ruleValue(t, r.totalHits, rule); got != 1 {
			t.Errorf("total_hits{rule=%s} = %v, want 1", rule, got)
		}
	}
	if got := ruleValue(t, r.totalHits, "tenant#0@_other"); got != 2 {
		t.Errorf("total_hits{rule=tenant#0@_other} = %v, want 2", got)
	}
	if n := series(r.totalHits); n > 3+3+1 {
		t.Errorf("%d total_hits series: the per-value cap did not hold", n)
	}

	// A new policy set forgets the per-value counters of its old limits.
	svc.SetPolicies(parse(t, statsPolicy))
	r.mu.Lock()
	n := len(r.values)
	r.mu.Unlock()
	if n != 0 {
		t.Errorf("%d limits keep per-value counters after SetPolicies", n)
	}
}

// TestRuleSeriesOnFirstCheck: a rule's series are made when a request first
// checks it, not when its policy is installed (a policy of 10,000 limits
// used to cost 50,000 series and their memory at start-up), and a new policy
// set deletes the series of the rules it no longer holds (they used to stay
// for the life of the process, one more set for every changed policy).
func TestRuleSeriesOnFirstCheck(t *testing.T) {
	c := &clock{}
	c.ns.Store(epoch.UnixNano())
	svc, err := New(memory.New(memory.Options{Now: c.Now}), parse(t, statsPolicy), Options{Logger: quiet, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	r := svc.rules
	count := func() (n int) {
		for _, v := range []*prometheus.CounterVec{r.totalHits, r.overLimit, r.nearLimit, r.withinLimit, r.shadowMode} {
			n += series(v)
		}
		return n
	}
	if n := count(); n != 0 {
		t.Errorf("%d rule series before any request; want 0", n)
	}
	f := &fixture{svc: svc, clock: c}
	f.call(t, req("stats", desc("user=alice")))
	f.call(t, req("stats", desc("user=bob")))
	f.call(t, req("stats", desc("tenant=t1")))
	if n := count(); n != 2*5 {
		t.Errorf("%d rule series after checks of two rules (user#0, tenant#0@tenant=t1); want 10", n)
	}
	if got := ruleValue(t, r.totalHits, "user#0"); got != 2 {
		t.Errorf("total_hits{rule=user#0} = %v, want 2", got)
	}
	// The new set keeps user#0 and drops the tenant rule.
	svc.SetPolicies(parse(t, "domain: stats\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 10}\n"))
	if n := count(); n != 5 {
		t.Errorf("%d rule series after a set without the tenant rule; want 5 (user#0's)", n)
	}
	if got := ruleValue(t, r.totalHits, "user#0"); got != 2 {
		t.Errorf("total_hits{rule=user#0} = %v after SetPolicies, want 2 (kept)", got)
	}
}
