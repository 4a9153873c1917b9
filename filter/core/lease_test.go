package core

import (
	"strconv"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
)

// leaseVMs returns n VMs of one proxy (one shared data) with quotaConfig.
func leaseVMs(t *testing.T, n int) ([]*testbed, *sharedData) {
	d := newSharedData()
	vms := make([]*testbed, n)
	for i := range vms {
		vms[i] = newTestbedOn(t, quotaConfig, d)
	}
	return vms, d
}

// tick runs every VM's tick at its now.
func tick(vms []*testbed) {
	for _, b := range vms {
		b.runTick()
	}
}

// TestLeaseIsOnePoolPerProxy: the quota one VM received is spent by all
// the VMs of the proxy, each unit once: with four VMs taking turns, the
// granted units admit exactly that many requests without a call, then
// one VM calls out (the others' requests wait for that call). A VM reads
// the pool only once a lease has been announced (its own, or another's,
// read when it is configured and on its tick): before that, a request
// makes no read of the shared data.
func TestLeaseIsOnePoolPerProxy(t *testing.T) {
	vms, _ := leaseVMs(t, 4)
	req := map[string]string{":method": "GET", ":path": "/"}
	b1 := vms[1]
	gets := b1.host.leaseGets // configuring the plugin read whether a lease was announced
	if _, a := b1.request(req, "10.0.0.1:1"); a != Pause || b1.host.leaseGets != gets {
		t.Fatalf("before any lease: action %d, %d reads of the lease pools", a, b1.host.leaseGets-gets)
	}
	b1.deliver(grpcOK(t, &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OK}}}))

	b0 := vms[0]
	b0.request(req, "10.0.0.1:1")
	const granted = 20
	b0.deliver(quotaAnswer(t, b0.host, granted, time.Second)) // the answered request took one
	tick(vms)
	calls := func() (n int) {
		for _, b := range vms {
			n += len(b.host.calls)
		}
		return n
	}
	before := calls()
	admitted := 0
	for i := 0; i < 3*granted; i++ {
		b := vms[i%len(vms)]
		if _, a := b.request(req, "10.0.0.1:1"); a == Continue {
			admitted++
		}
	}
	if admitted != granted-1 {
		t.Fatalf("the VMs admitted %d requests from a pool of %d", admitted, granted-1)
	}
	var fromQuota, waited int64
	for _, b := range vms {
		fromQuota += b.host.counters[MetricQuotaAllowed]
		waited += b.host.counters[MetricLeaseWaited]
	}
	// Once the pool is spent, the first request calls and the others, of
	// every VM, wait for that call (wait.go).
	if fromQuota != granted-1 || calls()-before != 1 || waited != int64(3*granted-admitted-1) {
		t.Fatalf("%d counted from quotas, %d calls, %d waited", fromQuota, calls()-before, waited)
	}
}

// TestLeaseReadFromTheStart: a VM configured after another received a
// lease (Envoy's reload of a VM that trapped, or a new worker) spends the
// pool from its first request, without waiting for its first tick: a
// lease lasts about a tick period, and the units a trapped VM left would
// otherwise expire unspent (e2e/abi TestLeaseSurvivesReload).
func TestLeaseReadFromTheStart(t *testing.T) {
	d := newSharedData()
	a := newTestbedOn(t, quotaConfig, d)
	req := map[string]string{":method": "GET", ":path": "/"}
	a.request(req, "10.0.0.1:1")
	const granted = 5
	a.deliver(quotaAnswer(t, a.host, granted, time.Second)) // the answered request took one
	fresh := newTestbedOn(t, quotaConfig, d)
	for i := range granted - 1 {
		if _, act := fresh.request(req, "10.0.0.1:1"); act != Continue || len(fresh.host.calls) != 0 {
			t.Fatalf("request %d of the fresh VM: action %d, %d calls", i, act, len(fresh.host.calls))
		}
	}
	if _, act := fresh.request(req, "10.0.0.1:1"); act != Pause {
		t.Fatalf("the pool of %d units admitted one more: action %d", granted-1, act)
	}
}

// TestLeaseExpiresForEveryVM: a unit is not spent at or after the lease's
// valid_until, by any VM.
func TestLeaseExpiresForEveryVM(t *testing.T) {
	vms, _ := leaseVMs(t, 2)
	req := map[string]string{":method": "GET", ":path": "/"}
	vms[0].request(req, "10.0.0.1:1")
	vms[0].deliver(quotaAnswer(t, vms[0].host, 10, 100*time.Millisecond))
	tick(vms)
	if _, a := vms[1].request(req, "10.0.0.1:1"); a != Continue {
		t.Fatalf("within validity: action %d", a)
	}
	for _, b := range vms {
		b.host.now += int64(100 * time.Millisecond)
	}
	for i, b := range vms {
		if _, a := b.request(req, "10.0.0.1:1"); a != Pause {
			t.Fatalf("VM %d spent an expired lease: action %d", i, a)
		}
	}
}

// TestLeaseOverridesAnotherVMsPrecheck: a VM whose precheck learnt the
// descriptor is over its limit still admits the units another VM was
// granted (the control plane debited them: rejecting would admit less than
// the limit), and rejects again once they are spent.
func TestLeaseOverridesAnotherVMsPrecheck(t *testing.T) {
	vms, _ := leaseVMs(t, 2)
	req := map[string]string{":method": "GET", ":path": "/"}
	a, b := vms[0], vms[1]
	a.request(req, "10.0.0.1:1")
	a.deliver(quotaAnswer(t, a.host, 3, time.Second))
	b.request(req, "10.0.0.1:1") // b has not heard of leases yet: it calls
	b.deliver(grpcOK(t, &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OVER_LIMIT,
			DurationUntilReset: durationpb.New(30 * time.Second)}},
		DynamicMetadata: metadata(t, map[string]any{"algorithm": "fixed_window", "limit": 10, "window_ms": 60000, "retry_after_ms": 30000}),
	}))
	tick(vms)
	for i := range 2 {
		if id, act := b.request(req, "10.0.0.1:1"); act != Continue || b.host.local[id].status != 0 {
			t.Fatalf("request %d on another VM's lease: action %d", i, act)
		}
	}
	if id, act := b.request(req, "10.0.0.1:1"); act != Pause || b.host.local[id].details != DetailsPrecheck {
		t.Fatalf("lease spent: the precheck does not reject: action %d", act)
	}
}

// TestLeaseTwoDescriptorsGiveBack: a request of two descriptors whose
// second has no unit takes none: the unit of the first goes back to its
// pool, and calls out.
func TestLeaseTwoDescriptorsGiveBack(t *testing.T) {
	const config = `{"cluster": "sluice_cp", "domain": "edge", "timeout": "25ms",
	  "rate_limits": [{"actions": [{"remote_address": {}}]}, {"actions": [{"request_headers": {"header_name": "x-k", "descriptor_key": "k"}}]}]}`
	d := newSharedData()
	b := newTestbedOn(t, config, d)
	one := newTestbedOn(t, quotaConfig, d) // the remote address alone
	req := map[string]string{":method": "GET", ":path": "/"}
	one.request(req, "10.0.0.1:1")
	one.deliver(quotaAnswer(t, one.host, 3, time.Second)) // 2 left
	b.runTick()
	calls := len(b.host.calls)
	if _, a := b.request(map[string]string{":method": "GET", ":path": "/", "x-k": "v"}, "10.0.0.1:1"); a != Pause || len(b.host.calls) != calls+1 {
		t.Fatalf("a request whose second descriptor has no lease: action %d", a)
	}
	for i := range 2 {
		if _, a := one.request(req, "10.0.0.1:1"); a != Continue {
			t.Fatalf("unit %d was not given back: action %d", i, a)
		}
	}
	if _, a := one.request(req, "10.0.0.1:1"); a != Pause {
		t.Fatal("more units than granted")
	}
}

// TestLeasesCostNothingToKeysWithout: once the proxy uses leases, requests
// of keys that never hold a pool (a load spread over many keys) read no
// pool (the pools' map says so), record no call under way for a pool, and
// so leave the worker no state of their own. The map has one bit a slot,
// and a key whose slot is the leased key's (the proxy's random hash seed
// decides which) reads that slot: only those.
func TestLeasesCostNothingToKeysWithout(t *testing.T) {
	vms, _ := leaseVMs(t, 2)
	a, b := vms[0], vms[1]
	a.request(map[string]string{":method": "GET", ":path": "/"}, "10.0.0.1:1")
	granted := len(a.host.leaseKeys)
	a.deliver(quotaAnswer(t, a.host, 20, time.Hour))
	leased := "" // the slot the grant wrote
	for _, k := range a.host.leaseKeys[granted:] {
		if k != "sluice.leases.map" && k != "sluice.leases.on" {
			leased = k
			break
		}
	}
	tick(vms) // b hears of leases
	if !b.w.leases.seen {
		t.Fatal("b did not hear of leases")
	}
	gets := len(b.host.leaseKeys)
	for i := range 100 {
		_, action := b.request(map[string]string{":method": "GET", ":path": "/"}, "10.1.0."+strconv.Itoa(i)+":1")
		if action != Pause {
			t.Fatalf("request %d: action %d", i, action)
		}
	}
	// (one read of the pools' map, for all of them)
	maps, others := 0, 0
	for _, k := range b.host.leaseKeys[gets:] {
		switch k {
		case "sluice.leases.map":
			maps++
		case leased:
		default:
			others++
		}
	}
	if maps > 1 || others != 0 || len(b.w.leases.asking) != 0 {
		t.Fatalf("100 requests of keys without pools: %d reads of the lease pools' map, %d of slots no key leased (%v), %d calls recorded as under way for a pool",
			maps, others, b.host.leaseKeys[gets:], len(b.w.leases.asking))
	}
}

// TestLeaseCollisionAsksNoQuota: two keys in one slot of the pools. The
// first key's live pool stays when the second's grant arrives (the units
// granted to the second are lost); the second key's next calls ask for no
// quota (no QuotaField), so the control plane hands it no more shares to
// lose, until lease.Recent has passed; the first key spends its pool.
func TestLeaseCollisionAsksNoQuota(t *testing.T) {
	b := newTestbedSlots(t, quotaConfig, newSharedData(), 1) // one slot: every key collides
	req := map[string]string{":method": "GET", ":path": "/"}
	b.request(req, "10.0.0.1:1")
	b.deliver(quotaAnswer(t, b.host, 10, time.Second)) // a's pool: 9 units
	b.request(req, "10.0.0.2:1")
	if !asksQuota(sentRequest(t, b.lastCall().body)) {
		t.Fatal("b's first call asked for no quota")
	}
	b.deliver(quotaAnswer(t, b.host, 10, time.Second)) // lost: a's pool stays
	if _, a := b.request(req, "10.0.0.1:1"); a != Continue {
		t.Fatalf("a's pool did not survive b's grant: action %d", a)
	}
	calls := len(b.host.calls)
	if _, a := b.request(req, "10.0.0.2:1"); a != Pause || len(b.host.calls) != calls+1 {
		t.Fatalf("b after its lost grant: action %d, %d calls", a, len(b.host.calls)-calls)
	}
	if asksQuota(sentRequest(t, b.lastCall().body)) {
		t.Fatal("b's call after its lost grant asked for a quota")
	}
	b.deliver(okNoQuota(t))
	b.host.now += int64(time.Second) // lease.Recent later
	b.request(req, "10.0.0.2:1")
	if !asksQuota(sentRequest(t, b.lastCall().body)) {
		t.Fatal("b still asks for no quota after lease.Recent")
	}
}
