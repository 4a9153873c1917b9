package main

import (
	"fmt"
	"maps"
	"strconv"
	"strings"
	"testing"
)

// TestSpreadLeaseHostCalls: leases that cannot help cost nothing. Once the
// proxy uses leases (a VM received one and the others heard of it), a
// request whose key holds no pool (bench-envoy's spread load: every key
// new) makes the same host calls over its whole stream as before any lease
// was heard of, and the guest allocates nothing for it.
func TestSpreadLeaseHostCalls(t *testing.T) {
	// A table of 500 keys, filled by the warm-up: new keys then replace
	// old ones, and allocate nothing (TestWasmCalloutAllocatesNothing).
	config := strings.Replace(sharedConfig, `"precheck": {"enabled": true}`, `"precheck": {"enabled": true, "max_entries": 500}`, 1)
	shared := newHostShared()
	var c hostCounter
	a := newWasmHostShared(t, c.clock(), filterWasmDev, config, shared)
	b := newWasmHostShared(t, c.context(), filterWasmDev, config, shared)
	for _, h := range []*wasmHost{a, b} {
		if !h.configure() {
			t.Fatalf("configuration refused: %v", h.logs)
		}
	}
	b.quiet = true
	admitted := hostAdmittedOne(t)
	run := func(id uint32, user string) map[string]int {
		return c.callout(b, id, user, func(call uint32) { b.deliver(call, admitted) })
	}
	spread := func(from, n int) (mallocs uint64) {
		before := b.call("sluice_test_mallocs")
		for i := from; i < from+n; i++ {
			req := map[string]string{":method": "GET", ":path": "/", "x-user": "s" + strconv.Itoa(i)}
			b.calloutStream(uint32(100+i%2), req, func(call uint32) { b.deliver(call, admitted) })
		}
		return b.call("sluice_test_mallocs") - before
	}
	spread(0, 1000) // warm: the table fills, buffers reach their size
	run(10, "warm")
	plain := run(11, "plain")
	plainMallocs := spread(1000, 200)

	hearLease(t, a, b)
	spread(4000, 1000)
	run(12, "warm2")
	leased := run(13, "leased-proxy")
	leasedMallocs := spread(6000, 200)
	t.Logf("host calls of a spread request: %v before leases, %v once the proxy uses them", plain, leased)
	t.Logf("guest allocations over 200 spread requests: %d before leases, %d once the proxy uses them", plainMallocs, leasedMallocs)
	if !maps.Equal(plain, leased) || leasedMallocs != plainMallocs {
		t.Errorf("a request whose key holds no pool pays for leases: %s", diff(plain, leased))
	}
}

// diff lists the host calls that differ between two counts.
func diff(before, after map[string]int) string {
	s := ""
	for k, v := range after {
		if before[k] != v {
			s += fmt.Sprintf(" %s %d->%d", k, before[k], v)
		}
	}
	for k, v := range before {
		if _, ok := after[k]; !ok {
			s += fmt.Sprintf(" %s %d->0", k, v)
		}
	}
	return s
}
