package core

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/filter/proxywasm/shareddata"
)

// TestSharedBlockRejectsInEveryVM: one VM hears the control plane deny a
// descriptor; the proxy's other VMs (and a VM started later, as after a
// reload) reject it locally, with no call, until the denial's PassAt less
// their own call timeout and 1us, and call again from then on: the
// precheck's invariant, whichever VM learnt the block. A VM reads the
// shared data only for a request it would otherwise send to the control
// plane, and once it holds the block, not at all.
func TestSharedBlockRejectsInEveryVM(t *testing.T) {
	d := newSharedData()
	a := newTestbedOn(t, testConfig, d)
	b := newTestbedOn(t, testConfig, d)
	const remote = "10.0.0.9:4242"
	a.request(apiRequest, remote)
	sentAt := a.host.now
	a.host.now += 3e6 // the answer arrives 3ms later
	a.deliver(overLimitAnswer(t, 6000))
	if a.host.counters[MetricOverLimit] != 1 {
		t.Fatalf("counters %v", a.host.counters)
	}
	idA, _ := a.request(apiRequest, remote)
	if a.host.local[idA].details != DetailsPrecheck {
		t.Fatalf("A's own precheck did not reject: %+v", a.host.local[idA])
	}

	b.host.now = a.host.now
	gets := b.host.sharedGets
	id, action := b.request(apiRequest, remote)
	if action != Pause || len(b.host.calls) != 0 || b.host.local[id].details != DetailsPrecheck {
		t.Fatalf("B: action %d, %d calls, local %+v; logs %v", action, len(b.host.calls), b.host.local[id], b.host.logs)
	}
	if b.host.counters[MetricPrecheckRejected] != 1 || b.host.counters[MetricPrecheckShared] != 1 {
		t.Fatalf("B's counters %v", b.host.counters)
	}
	if n := b.host.sharedGets - gets; n != 3 { // the live mark, then one per descriptor up to the blocked one
		t.Fatalf("B read the shared data %d times for its first request", n)
	}
	// The same 429 as the VM that heard the denial gives.
	if got, want := b.host.local[id].headers, a.host.local[idA].headers; len(got) == 0 || !equalHeaders(got, want) {
		t.Fatalf("B's 429 headers %v, A's %v", got, want)
	}
	gets = b.host.sharedGets
	b.request(apiRequest, remote)
	if b.host.sharedGets != gets || len(b.host.calls) != 0 || b.host.counters[MetricPrecheckRejected] != 2 {
		t.Fatalf("B's second request: %d shared reads, %d calls, counters %v", b.host.sharedGets-gets, len(b.host.calls), b.host.counters)
	}

	// The block ends at PassAt (sent + 6s) less each VM's own timeout and
	// 1us: 25ms here, 200ms for a VM configured with a longer timeout.
	for _, timeout := range []string{"25ms", "200ms"} {
		config := strings.Replace(testConfig, `"timeout": "25ms"`, `"timeout": "`+timeout+`"`, 1)
		ms := map[string]int64{"25ms": 25e6, "200ms": 200e6}[timeout]
		end := sentAt + 6e9 - ms - 1e3
		for _, tt := range []struct {
			now    int64
			reject bool
		}{{end - 1, true}, {end, false}} {
			c := newTestbedOn(t, config, d) // a VM that never heard the denial
			c.host.now = tt.now
			id, _ := c.request(apiRequest, remote)
			rejected := c.host.local[id].details == DetailsPrecheck
			if rejected != tt.reject || len(c.host.calls) != map[bool]int{true: 0, false: 1}[tt.reject] {
				t.Fatalf("timeout %s, at end%+d: rejected %v, %d calls", timeout, tt.now-end, rejected, len(c.host.calls))
			}
		}
	}
}

// TestSharedBlockNotForAnotherDomain: plugins of another domain sharing the
// VM id do not see the block (the same descriptor there is another limit).
func TestSharedBlockNotForAnotherDomain(t *testing.T) {
	d := newSharedData()
	a := newTestbedOn(t, testConfig, d)
	a.request(apiRequest, "10.0.0.9:1")
	a.deliver(overLimitAnswer(t, 6000))
	o := newTestbedOn(t, strings.Replace(testConfig, `"domain": "edge"`, `"domain": "other"`, 1), d)
	o.host.now = a.host.now
	if _, action := o.request(apiRequest, "10.0.0.9:1"); action != Pause || len(o.host.calls) != 1 {
		t.Fatalf("another domain's request was not sent: %d calls", len(o.host.calls))
	}
}

// TestSharedBlockCASLostStaysLocal: when another VM wins the slot on every
// attempt, the block stays in the VM that heard it (which still rejects),
// counted in sluice.shared_cas_retries and sluice.shared_lost.
func TestSharedBlockCASLostStaysLocal(t *testing.T) {
	d := newSharedData()
	a := newTestbedOn(t, testConfig, d)
	a.request(apiRequest, "10.0.0.9:1")
	// Every slot holds a block already, and every set loses the race.
	for i := range 4096 {
		d.m["sluice.blocks."+strconv.Itoa(i)] = sharedValue{[]byte("x"), 1}
	}
	d.alwaysMismatch = true
	a.deliver(overLimitAnswer(t, 6000))
	if a.host.counters[MetricSharedCASRetries] != 3 || a.host.counters[MetricSharedLost] != 1 {
		t.Fatalf("counters %v", a.host.counters)
	}
	if id, _ := a.request(apiRequest, "10.0.0.9:1"); a.host.local[id].details != DetailsPrecheck {
		t.Fatal("the block is not kept locally")
	}
}

func equalHeaders(a, b [][2]string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestSharedStateOff: with shared_state false each VM keeps its own state,
// as before the VMs shared it: a block one VM heard is not another's (it
// calls the control plane), and a lease one VM was granted is spent by
// that VM alone; neither touches the proxy's shared data.
func TestSharedStateOff(t *testing.T) {
	off := strings.Replace(testConfig, `"timeout"`, `"shared_state": false, "timeout"`, 1)
	d := newSharedData()
	a, b := newTestbedOn(t, off, d), newTestbedOn(t, off, d)
	a.request(apiRequest, "10.0.0.9:1")
	a.deliver(overLimitAnswer(t, 6000))
	if id, _ := a.request(apiRequest, "10.0.0.9:1"); a.host.local[id].details != DetailsPrecheck {
		t.Fatal("the VM that heard the denial does not reject")
	}
	b.host.now = a.host.now
	if _, action := b.request(apiRequest, "10.0.0.9:1"); action != Pause || len(b.host.calls) != 1 {
		t.Fatalf("another VM did not call: %d calls", len(b.host.calls))
	}

	offQ := strings.Replace(quotaConfig, `"timeout"`, `"shared_state": false, "timeout"`, 1)
	q0, q1 := newTestbedOn(t, offQ, d), newTestbedOn(t, offQ, d)
	req := map[string]string{":method": "GET", ":path": "/"}
	q0.request(req, "10.0.0.1:1")
	q0.deliver(quotaAnswer(t, q0.host, 3, time.Second)) // 2 left, for q0
	tick([]*testbed{q0, q1})
	for i := range 2 {
		if _, act := q0.request(req, "10.0.0.1:1"); act != Continue {
			t.Fatalf("unit %d of the VM's own lease: action %d", i, act)
		}
	}
	if _, act := q0.request(req, "10.0.0.1:1"); act != Pause {
		t.Fatal("more units than granted")
	}
	if _, act := q1.request(req, "10.0.0.1:1"); act != Pause {
		t.Fatal("another VM spent the lease")
	}
	if gets := a.host.sharedGets + b.host.sharedGets + q0.host.sharedGets + q1.host.sharedGets; len(d.m) != 0 || gets != 0 {
		t.Fatalf("the proxy's shared data was used: %d keys, %d reads", len(d.m), gets)
	}
}

// TestSharedBlockSeenWithinLiveRefresh: with no block live in the proxy a
// VM reads no slot for the requests it sends to the control plane, only
// the proxy's live mark once per shareddata.LiveRefresh; a block another
// VM publishes meanwhile is used from the VM's next read of the mark, at
// most LiveRefresh later.
func TestSharedBlockSeenWithinLiveRefresh(t *testing.T) {
	d := newSharedData()
	a := newTestbedOn(t, testConfig, d)
	b := newTestbedOn(t, testConfig, d)
	const remote = "10.0.0.9:4242"
	gets := b.host.sharedGets
	b.request(apiRequest, remote) // reads the mark: nothing is live
	b.request(map[string]string{":path": "/", "x-api-key": "k2"}, remote)
	if n := b.host.sharedGets - gets; n != 1 || len(b.host.calls) != 2 {
		t.Fatalf("B: %d shared reads, %d calls for 2 requests", n, len(b.host.calls))
	}
	readAt := b.host.now

	a.host.now = readAt
	a.request(apiRequest, remote)
	a.deliver(overLimitAnswer(t, 6000))
	for _, tt := range []struct {
		now   int64
		calls int // B's calls so far
	}{
		{readAt + shareddata.LiveRefresh - 1, 3}, // B still trusts its read: asks the control plane
		{readAt + shareddata.LiveRefresh, 3},     // reads the mark, then the slots: A's block
	} {
		b.host.now = tt.now
		id, _ := b.request(apiRequest, remote)
		if len(b.host.calls) != tt.calls {
			t.Fatalf("at read%+d: %d calls, want %d", tt.now-readAt, len(b.host.calls), tt.calls)
		}
		if tt.now-readAt == shareddata.LiveRefresh && b.host.local[id].details != DetailsPrecheck {
			t.Fatalf("A's block not used LiveRefresh after B's read: %+v", b.host.local[id])
		}
	}
}
