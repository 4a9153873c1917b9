package main

import (
	"strconv"
	"strings"
	"testing"
)

// TestWasmCalloutAllocatesNothing counts the guest's heap allocations
// (runtime.MemStats.Mallocs, exported by the sluicetest build) over the
// whole streams of requests that each call the control plane for a new key
// and are admitted (bench-envoy's spread load), over either transport,
// once the precheck table is full: garbage there would make the collector
// scan the table, as big as the keys it holds, again and again.
func TestWasmCalloutAllocatesNothing(t *testing.T) {
	for _, transport := range []string{"http", "grpc"} {
		t.Run(transport, func(t *testing.T) {
			config := strings.Replace(sharedConfig, `"precheck": {"enabled": true}`,
				`"transport": "`+transport+`", "precheck": {"enabled": true, "max_entries": 500}`, 1)
			h := newWasmHostShared(t, t.Context(), filterWasmDev, config, newHostShared())
			if !h.configure() {
				t.Fatal(h.logs)
			}
			h.quiet = true
			answer := hostAdmittedOne(t)
			users := make([]map[string]string, 2000)
			for i := range users {
				users[i] = map[string]string{":method": "GET", ":path": "/", "x-user": "u" + strconv.Itoa(i)}
			}
			run := func(from, n int) {
				for i := from; i < from+n; i++ {
					h.calloutStream(uint32(100+i%2), users[i%len(users)], func(call uint32) {
						if transport == "grpc" {
							h.deliverGRPC(call, answer.body[5:])
						} else {
							h.deliver(call, answer)
						}
					})
				}
			}
			run(0, 3000) // warm up: the table fills, buffers reach their size
			before := h.call("sluice_test_mallocs")
			calls, resumed := len(h.calls), h.resumed[100]+h.resumed[101]
			run(3000, 1000)
			after := h.call("sluice_test_mallocs")
			if c, r := len(h.calls)-calls, h.resumed[100]+h.resumed[101]-resumed; c != 1000 || r != 1000 {
				t.Fatalf("%d calls, %d resumed for 1000 requests", c, r)
			}
			if after != before {
				t.Fatalf("the guest allocated %d times in 1000 requests that called out", after-before)
			}
		})
	}
}
