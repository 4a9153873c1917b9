package e2e

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/e2e/stack"
)

// leaseWindows records, at each second boundary of a lease test, what the
// control planes and the Envoys counted in the second before: where the
// calls that were not decided in the filter came from.
type leaseWindows struct {
	filter stack.Filter // whose counters are read
	cps    []*stack.ControlPlane
	stats  []func() (map[string]int64, error)
	mu     sync.Mutex
	lines  []string
	lastCP map[string]float64
	lastE  map[string]int64
}

// leaseCPCounters are the control planes' counters each window shows.
var leaseCPCounters = []struct{ short, name, label string }{
	{"calls", "sluice_lease_calls_total", ""},
	{"granted", "sluice_lease_granted_units_total", ""},
	{"local", "sluice_lease_local_decisions_total", ""},
	{"shares", "sluice_lease_shares_total", ""},
	{"shared", "sluice_lease_shared_units_total", ""},
	{"expired", "sluice_lease_expired_units_total", ""},
	{"unleased:unknown", "sluice_lease_unleased_checks_total", "unknown_remaining"},
	{"rate", "sluice_lease_unleased_checks_total", "no_rate"},
	{"small", "sluice_lease_unleased_checks_total", "small"},
	{"fetching", "sluice_lease_unleased_checks_total", "fetching"},
	{"unshared:none", "sluice_lease_unshared_total", "no_lease"},
	{"slow", "sluice_lease_unshared_total", "slow"},
	{"valid", "sluice_lease_unshared_total", "validity"},
}

// sample reads every counter once.
func (w *leaseWindows) sample() (map[string]float64, map[string]int64) {
	cp := map[string]float64{}
	for _, c := range w.cps {
		m, err := stack.Scrape(c.HTTPURL() + "/metrics")
		if err != nil {
			continue
		}
		for _, k := range leaseCPCounters {
			if k.label != "" {
				cp[k.short] += m.Sum(k.name, "reason", k.label)
			} else {
				cp[k.short] += m.Sum(k.name)
			}
		}
	}
	e := map[string]int64{}
	for _, f := range w.stats {
		s, err := f()
		if err != nil {
			continue
		}
		for _, n := range []string{"quota_allowed", "allowed", "over_limit"} {
			e[n] += s[w.filter.Stat("sluice."+n)]
		}
	}
	return cp, e
}

// run samples at start and at every second after it until end.
func (w *leaseWindows) run(start, end time.Time) {
	time.Sleep(time.Until(start))
	w.lastCP, w.lastE = w.sample()
	for at := start.Add(time.Second); !at.After(end); at = at.Add(time.Second) {
		time.Sleep(time.Until(at))
		cp, e := w.sample()
		var b strings.Builder
		fmt.Fprintf(&b, "filter quota/called %d/%d;", e["quota_allowed"]-w.lastE["quota_allowed"], e["allowed"]-w.lastE["allowed"])
		for _, k := range leaseCPCounters {
			fmt.Fprintf(&b, " %s %v", k.short, cp[k.short]-w.lastCP[k.short])
		}
		w.mu.Lock()
		w.lines = append(w.lines, b.String())
		w.mu.Unlock()
		w.lastCP, w.lastE = cp, e
	}
}

// String is one line per second.
func (w *leaseWindows) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var b strings.Builder
	for i, l := range w.lines {
		fmt.Fprintf(&b, "\n  second %d: %s", i, l)
	}
	return b.String()
}
