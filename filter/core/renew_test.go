package core

import (
	"fmt"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/filter/core/lease"
	"github.com/sluicehq/sluice/filter/core/rlsproto"
)

// prefetchVMs returns n VMs of one proxy with prefetch on, whose first VM
// received a lease of units (the request it answered took one of them),
// valid for valid; every VM has heard of it (its tick).
func prefetchVMs(t *testing.T, n int, units uint32, valid time.Duration) []*testbed {
	t.Helper()
	d := newSharedData()
	vms := make([]*testbed, n)
	for i := range vms {
		vms[i] = newTestbedOn(t, prefetchConfig, d)
	}
	vms[0].request(prefetchReq, "10.0.0.1:1")
	vms[0].deliver(quotaAnswer(t, vms[0].host, units, valid))
	tick(vms)
	return vms
}

var prefetchReq = map[string]string{":method": "GET", ":path": "/"}

// totalCalls is the calls every VM made.
func totalCalls(vms []*testbed) (n int) {
	for _, b := range vms {
		n += len(b.host.calls)
	}
	return n
}

// counter sums a counter over the VMs.
func counter(vms []*testbed, name string) (n int64) {
	for _, b := range vms {
		n += b.host.counters[name]
	}
	return n
}

// advance moves every VM's clock (monotonic and wall) by d.
func advance(vms []*testbed, d time.Duration) {
	for _, b := range vms {
		b.host.now += int64(d)
	}
}

// checkRenewalFrame checks that a renewal is the key's request: domain
// edge, the one remote_address descriptor, cost 1, the caller named.
func checkRenewalFrame(t *testing.T, body []byte) {
	t.Helper()
	req := sentRequest(t, body)
	if req.Domain != "edge" || len(req.Descriptors) != 1 || len(req.Descriptors[0].Entries) != 1 ||
		req.Descriptors[0].Entries[0].Key != "remote_address" || req.Descriptors[0].Entries[0].Value != "10.0.0.1" ||
		req.HitsAddend > 1 || req.Descriptors[0].HitsAddend != nil {
		t.Fatalf("renewal %v", req)
	}
	if !asksQuota(req) {
		t.Fatalf("the renewal does not name its caller (field %d)", rlsproto.QuotaField)
	}
}

// TestPrefetchOneRenewalAcrossVMs: the request that takes the last unit of
// the proxy's pool is admitted at once and sends one renewal, the only one
// of the two VMs; requests of either VM that then find the pool empty wait
// for it instead of calling, and its grant admits them (all its units: the
// unit the renewal's call debited too).
func TestPrefetchOneRenewalAcrossVMs(t *testing.T) {
	vms := prefetchVMs(t, 2, 4, time.Second) // 3 units in the pool
	before := totalCalls(vms)
	for i := range 3 {
		if _, a := vms[(i+1)%2].request(prefetchReq, "10.0.0.1:1"); a != Continue {
			t.Fatalf("request %d on the pool: action %d", i, a)
		}
	}
	// vms[1], vms[0], vms[1] took them: vms[1] took the last
	if got := totalCalls(vms) - before; got != 1 || len(vms[1].host.calls) != 1 || counter(vms, MetricLeaseRenewals) != 1 {
		t.Fatalf("%d calls (%d of the VM that took the last unit), %d renewals counted", got, len(vms[1].host.calls), counter(vms, MetricLeaseRenewals))
	}
	checkRenewalFrame(t, vms[1].host.calls[0].body)
	local, a1 := vms[1].request(prefetchReq, "10.0.0.1:1")
	remote, a0 := vms[0].request(prefetchReq, "10.0.0.1:1")
	if a1 != Pause || a0 != Pause || totalCalls(vms)-before != 1 || counter(vms, MetricLeaseWaited) != 2 {
		t.Fatalf("requests on the empty pool: actions %d %d, %d calls, %d waited", a1, a0, totalCalls(vms)-before, counter(vms, MetricLeaseWaited))
	}
	quota := counter(vms, MetricQuotaAllowed)
	vms[1].deliver(renewalAnswer(t, vms[1].host, 3, time.Second, rlsproto.AlgorithmFixedWindow))
	if vms[1].host.resumed[local] != 1 {
		t.Fatal("the renewal's VM did not admit its waiting request")
	}
	tick(vms) // the other VM looks at the pool on its tick
	if vms[0].host.resumed[remote] != 1 || counter(vms, MetricQuotaAllowed) != quota+2 || counter(vms, MetricLeaseRenewalsGranted) != 1 {
		t.Fatalf("other VM's waiter resumed %d; %d from quotas, %d renewals granted", vms[0].host.resumed[remote],
			counter(vms, MetricQuotaAllowed)-quota, counter(vms, MetricLeaseRenewalsGranted))
	}
	// 3 units, 2 taken by the waiters: one more, then none (and a renewal)
	if _, a := vms[0].request(prefetchReq, "10.0.0.1:1"); a != Continue {
		t.Fatalf("the renewal's third unit: action %d", a)
	}
	if _, a := vms[0].request(prefetchReq, "10.0.0.1:1"); a != Pause || counter(vms, MetricLeaseRenewals) != 2 {
		t.Fatalf("past the renewal's units: action %d, %d renewals", a, counter(vms, MetricLeaseRenewals))
	}
}

// TestPrefetchRenewalEndsWithoutUnits: a renewal answered OVER_LIMIT, one
// that fails, and one answered OK without a quota leave no request
// waiting: each waiter calls on its own (or, for the OK answer, is admitted
// by the unit the renewal debited), and the other VM's waiters see the
// pool's record end on their tick.
func TestPrefetchRenewalEndsWithoutUnits(t *testing.T) {
	overLimit := func(t *testing.T) *fakeAnswer {
		return grpcOK(t, &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
			Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OVER_LIMIT}}})
	}
	failed := func(*testing.T) *fakeAnswer {
		return &fakeAnswer{headers: map[string]string{":status": "503"}, trailers: map[string]string{}}
	}
	for _, c := range []struct {
		name     string
		answer   func(*testing.T) *fakeAnswer
		admitted bool // the renewal's unit admits the local waiter
	}{{"over limit", overLimit, false}, {"failed", failed, false}, {"no answer", func(*testing.T) *fakeAnswer { return nil }, false},
		{"ok without quota", okNoQuota, true}} {
		t.Run(c.name, func(t *testing.T) {
			vms := prefetchVMs(t, 2, 3, time.Second) // 2 units in the pool
			if _, a := vms[1].request(prefetchReq, "10.0.0.1:1"); a != Continue || len(vms[1].host.calls) != 0 {
				t.Fatalf("a unit of two: action %d, %d calls", a, len(vms[1].host.calls))
			}
			if _, a := vms[1].request(prefetchReq, "10.0.0.1:1"); a != Continue || len(vms[1].host.calls) != 1 {
				t.Fatalf("the last unit: action %d, %d calls", a, len(vms[1].host.calls))
			}
			local, _ := vms[1].request(prefetchReq, "10.0.0.1:1")
			remote, _ := vms[0].request(prefetchReq, "10.0.0.1:1")
			calls := totalCalls(vms)
			vms[1].deliver(c.answer(t))
			tick(vms)
			for i, b := range vms {
				if n := len(b.w.leases.waiting); n != 0 {
					t.Fatalf("VM %d: %d requests still wait", i, n)
				}
			}
			if c.admitted {
				if vms[1].host.resumed[local] != 1 || len(vms[1].host.calls) != 1 {
					t.Fatalf("the local waiter was not admitted by the renewal's unit: resumed %d", vms[1].host.resumed[local])
				}
			} else if len(vms[1].host.calls) != 2 {
				t.Fatalf("the local waiter did not call: %d calls", len(vms[1].host.calls))
			}
			if got := len(vms[0].host.calls); got != 2 || vms[0].host.calls[1].stream != remote {
				t.Fatalf("the other VM's waiter did not call: %d calls", got)
			}
			want := 1 // the other VM's waiter
			if !c.admitted {
				want++
			}
			if totalCalls(vms)-calls != want || counter(vms, MetricLeaseRenewalsGranted) != 0 || counter(vms, MetricLeaseRenewalLost) != 0 {
				t.Fatalf("%d calls after the renewal, %d granted, %d lost", totalCalls(vms)-calls,
					counter(vms, MetricLeaseRenewalsGranted), counter(vms, MetricLeaseRenewalLost))
			}
		})
	}
}

// TestPrefetchUnitLost: a renewal answered OK without a quota while no
// request waits loses the unit it debited, counted.
func TestPrefetchUnitLost(t *testing.T) {
	vms := prefetchVMs(t, 1, 3, time.Second)
	b := vms[0]
	b.request(prefetchReq, "10.0.0.1:1")
	b.request(prefetchReq, "10.0.0.1:1") // the last unit: a renewal
	b.deliver(okNoQuota(t))
	if b.host.counters[MetricLeaseRenewalLost] != 1 {
		t.Fatalf("%d units lost", b.host.counters[MetricLeaseRenewalLost])
	}
}

// TestPrefetchAtTheEnd: a pool the VM saw drain is renewed by the tick
// lease.Gap after it ends, once: a key idle since is not renewed again, nor
// is a key whose pool the VM never spent from. Requests that find the pool
// ended before the renewal is sent wait for it, the other VM's too.
func TestPrefetchAtTheEnd(t *testing.T) {
	vms := prefetchVMs(t, 2, 10, 100*time.Millisecond)
	spender, other := vms[0], vms[1]
	spender.request(prefetchReq, "10.0.0.1:1")
	spender.request(prefetchReq, "10.0.0.1:1") // 7 left: the pool drains
	if spender.host.tick > uint32((100*time.Millisecond+time.Duration(lease.Gap))/time.Millisecond) {
		t.Fatalf("the tick (%d ms) is not set for the pool's end", spender.host.tick)
	}
	advance(vms, 100*time.Millisecond) // the pool ended
	before := totalCalls(vms)
	tick(vms)
	if totalCalls(vms) != before {
		t.Fatal("a renewal before the control plane's lease ended")
	}
	// requests now wait for the renewal sent lease.Gap after the end
	w, a := spender.request(prefetchReq, "10.0.0.1:1")
	w2, a2 := other.request(prefetchReq, "10.0.0.1:1")
	if a != Pause || a2 != Pause || totalCalls(vms) != before {
		t.Fatalf("requests on the ended pool: actions %d %d, %d calls", a, a2, totalCalls(vms)-before)
	}
	advance(vms, time.Duration(lease.Gap))
	tick(vms)
	if got := totalCalls(vms) - before; got != 1 || len(other.host.calls) != 0 {
		t.Fatalf("%d renewals at the end (%d of the VM that never spent from the pool)", got, len(other.host.calls))
	}
	spender.deliver(renewalAnswer(t, spender.host, 5, 100*time.Millisecond, rlsproto.AlgorithmFixedWindow))
	tick(vms) // the other VM looks at the pool on its tick
	if spender.host.resumed[w] != 1 || other.host.resumed[w2] != 1 {
		t.Fatal("the waiting requests were not admitted from the renewal's grant")
	}
	// the waiters and another request spent from the new pool: it is
	// renewed when it ends
	if _, a := spender.request(prefetchReq, "10.0.0.1:1"); a != Continue {
		t.Fatalf("a request on the renewed pool: action %d", a)
	}
	advance(vms, 100*time.Millisecond+time.Duration(lease.Gap))
	tick(vms)
	if got := totalCalls(vms) - before; got != 2 || len(other.host.calls) != 0 {
		t.Fatalf("%d renewals after the second pool ended", got)
	}
	spender.deliver(renewalAnswer(t, spender.host, 5, 100*time.Millisecond, rlsproto.AlgorithmFixedWindow))
	// nobody spends from the third: no renewal when it ends, nor later
	advance(vms, 100*time.Millisecond+time.Duration(lease.Gap))
	tick(vms)
	advance(vms, time.Second)
	tick(vms)
	if got := totalCalls(vms) - before; got != 2 {
		t.Fatalf("%d renewals: an idle key was renewed", got)
	}
}

// TestPrefetchTakenOnce: a pool taken from once, a key too seldom used for
// leases to help, is not renewed: not when its last unit is taken, not
// when it ends, and a request that finds it ended makes its own call at
// once (the call any request of the key would make without leases).
func TestPrefetchTakenOnce(t *testing.T) {
	vms := prefetchVMs(t, 2, 3, 100*time.Millisecond) // 2 units
	b := vms[0]
	before := totalCalls(vms)
	if _, a := b.request(prefetchReq, "10.0.0.1:1"); a != Continue {
		t.Fatalf("a unit of the pool: action %d", a)
	}
	advance(vms, 100*time.Millisecond+time.Duration(lease.Gap))
	tick(vms)
	if got := totalCalls(vms) - before; got != 0 || counter(vms, MetricLeaseRenewals) != 0 {
		t.Fatalf("%d calls, %d renewals of a pool taken from once", got, counter(vms, MetricLeaseRenewals))
	}
	if _, a := vms[1].request(prefetchReq, "10.0.0.1:1"); a != Pause || len(vms[1].host.calls) != 1 || counter(vms, MetricLeaseWaited) != 0 {
		t.Fatalf("a request on the ended pool: action %d, %d calls, %d waited", a, len(vms[1].host.calls), counter(vms, MetricLeaseWaited))
	}
	if _, a := b.request(prefetchReq, "10.0.0.1:1"); a != Pause || counter(vms, MetricLeaseWaited) != 1 {
		t.Fatalf("a request while that call is under way: action %d, %d waited", a, counter(vms, MetricLeaseWaited))
	}
	if counter(vms, MetricLeaseRenewals) != 0 {
		t.Fatalf("%d renewals", counter(vms, MetricLeaseRenewals))
	}
}

// TestPrefetchOwnUnitOfABucket: the unit a renewal debited goes into the
// pool with its share only for a window limit. For a token_bucket or gcra
// limit (or one the answer does not name) it admits a request waiting now,
// or is lost: held for later, it would let the bucket refill meanwhile and
// admit one more than the algorithm does.
func TestPrefetchOwnUnitOfABucket(t *testing.T) {
	for _, c := range []struct {
		alg     string
		waiting bool
		pool    int   // units the next requests take from the pool
		lost    int64 // units counted lost
	}{
		{rlsproto.AlgorithmFixedWindow, false, 4, 0},
		{rlsproto.AlgorithmSlidingWindow, false, 4, 0},
		{rlsproto.AlgorithmTokenBucket, false, 3, 1},
		{rlsproto.AlgorithmGCRA, false, 3, 1},
		{"", false, 3, 1},
		{rlsproto.AlgorithmTokenBucket, true, 3, 0},
	} {
		t.Run(fmt.Sprintf("%s/waiting=%v", c.alg, c.waiting), func(t *testing.T) {
			vms := prefetchVMs(t, 1, 3, time.Second) // 2 units in the pool
			b := vms[0]
			b.request(prefetchReq, "10.0.0.1:1")
			if _, a := b.request(prefetchReq, "10.0.0.1:1"); a != Continue || len(b.host.calls) != 2 {
				t.Fatalf("the last unit: action %d, %d calls", a, len(b.host.calls))
			}
			var waiter uint32
			if c.waiting {
				waiter, _ = b.request(prefetchReq, "10.0.0.1:1")
			}
			b.deliver(renewalAnswer(t, b.host, 4, time.Second, c.alg))
			if c.waiting && b.host.resumed[waiter] != 1 {
				t.Fatal("the waiting request was not admitted")
			}
			quota := b.host.counters[MetricQuotaAllowed]
			calls := len(b.host.calls)
			for i := range c.pool {
				if _, a := b.request(prefetchReq, "10.0.0.1:1"); a != Continue {
					t.Fatalf("unit %d of the renewal: action %d", i, a)
				}
			}
			if got := b.host.counters[MetricQuotaAllowed] - quota; got != int64(c.pool) {
				t.Fatalf("%d admitted from the pool, want %d", got, c.pool)
			}
			// the pool is spent: the next request waits for a renewal or calls
			if _, a := b.request(prefetchReq, "10.0.0.1:1"); a != Pause {
				t.Fatalf("past the pool (%d calls before, %d after): action %d", calls, len(b.host.calls), a)
			}
			if got := b.host.counters[MetricLeaseRenewalLost]; got != c.lost {
				t.Fatalf("%d units lost, want %d", got, c.lost)
			}
		})
	}
}
