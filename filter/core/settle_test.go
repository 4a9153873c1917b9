package core

import (
	"errors"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/sluicehq/sluice/filter/core/descriptors"
	"github.com/sluicehq/sluice/filter/core/settle"
	"google.golang.org/protobuf/types/known/durationpb"
)

// The settlement queue's tests (settle.go); the helpers are in usage_test.go.

// TestUsageMergeAndBatches: charges of one descriptor waiting together are
// merged; a batch goes when batch_max charges wait or the oldest has
// waited interval_ms; batches hold at most batch_max descriptors.
func TestUsageMergeAndBatches(t *testing.T) {
	b := newTestbed(t, usageConfig(`{"source": {"response_header": "x-u"}}`,
		`{"batch_max": 2, "interval_ms": 100, "queue_max": 16}`))
	usage := func(key, n string) {
		id := b.admit(key, nil)
		b.complete(id, map[string]string{"x-u": n}, nil, 0)
	}
	usage("a", "11") // 10
	usage("a", "21") // 20: merged
	if n := len(settleCalls(t, b.host)); n != 0 {
		t.Fatalf("%d settle calls before the interval", n)
	}
	if b.host.tick != 100 {
		t.Fatalf("tick period %d with charges waiting, want 100", b.host.tick)
	}
	usage("b", "6") // 5: two charges wait, a full batch
	calls := settleCalls(t, b.host)
	if len(calls) != 1 || strings.Join(calls[0].keys, " ") != "api_key=a api_key=b" || calls[0].charges[0] != 30 || calls[0].charges[1] != 5 {
		t.Fatalf("settle calls %+v, want one: a 30 (merged), b 5", calls)
	}
	b.answerCall(calls[0].id, okFor(t, 2))
	for _, k := range []string{"c", "d", "e"} {
		usage(k, "3")
	}
	// c and d went as a full batch; e waits for the interval.
	calls = settleCalls(t, b.host)
	if len(calls) != 2 || len(calls[1].keys) != 2 {
		t.Fatalf("settle calls %+v", calls)
	}
	b.host.now += int64(99 * time.Millisecond)
	b.runTick()
	if n := len(settleCalls(t, b.host)); n != 2 {
		t.Fatalf("e sent before its interval: %d calls", n)
	}
	b.host.now += int64(time.Millisecond)
	b.runTick()
	calls = settleCalls(t, b.host)
	if len(calls) != 3 || strings.Join(calls[2].keys, " ") != "api_key=e" || calls[2].charges[0] != 2 {
		t.Fatalf("settle calls %+v", calls)
	}
	if calls[0].token == calls[1].token || calls[1].token == calls[2].token || !strings.HasPrefix(calls[1].token, calls[0].token[:9]) {
		t.Fatalf("tokens %q %q %q: want distinct, one VM prefix", calls[0].token, calls[1].token, calls[2].token)
	}
	b.answerCall(calls[1].id, okFor(t, 2))
	b.answerCall(calls[2].id, okFor(t, 1))
	if b.host.counters[MetricUsageSettled] != 5 || b.host.counters[MetricUsageSettleCalls] != 3 {
		t.Fatalf("counters %v", b.host.counters)
	}
	q := b.w.usage.q
	if charges, batches := q.InBatches(); q.Waiting() != 0 || batches != 0 || b.w.calls.Len() != 0 || charges != 0 {
		t.Fatalf("settler not empty: %d waiting, %d in %d batches, %d calls", q.Waiting(), charges, batches, b.w.calls.Len())
	}
	b.runTick()
	if b.host.tick != tickPeriodMs {
		t.Fatalf("idle tick period %d, want %d", b.host.tick, tickPeriodMs)
	}
}

// TestUsageRetrySameToken: a batch that fails (no answer, an error status,
// an HTTP error) is sent again, backing off, with the same token and the
// same descriptors; once acknowledged it is never sent again.
func TestUsageRetrySameToken(t *testing.T) {
	b := newTestbed(t, usageConfig(`{"source": {"response_header": "x-u"}}`,
		`{"batch_max": 64, "interval_ms": 0, "timeout_ms": 500}`))
	id := b.admit("k1", nil)
	b.complete(id, map[string]string{"x-u": "101"}, nil, 0)
	first := settleCalls(t, b.host)
	if len(first) != 1 {
		t.Fatalf("%d settle calls", len(first))
	}
	failures := []*fakeAnswer{
		nil, // timeout
		{headers: map[string]string{":status": "503"}},
		{headers: map[string]string{":status": "200"}, trailers: map[string]string{"grpc-status": "14", "grpc-message": "unavailable"}},
	}
	last := first[0]
	for i, f := range failures {
		b.answerCall(last.id, f)
		b.runTick() // too early: backing off
		if n := len(settleCalls(t, b.host)); n != i+1 {
			t.Fatalf("failure %d: resent without backing off (%d calls)", i, n)
		}
		b.host.now += int64(20 * time.Second)
		b.runTick()
		calls := settleCalls(t, b.host)
		if len(calls) != i+2 {
			t.Fatalf("failure %d: not resent (%d calls)", i, len(calls))
		}
		last = calls[len(calls)-1]
		if last.token != first[0].token || string(last.body) != string(first[0].body) {
			t.Fatalf("resent as token %q body %x, want %q %x", last.token, last.body, first[0].token, first[0].body)
		}
	}
	// A call the proxy never answers is given up on at the tick.
	b.host.now += int64(2 * time.Second)
	b.runTick()
	b.host.now += int64(20 * time.Second)
	b.runTick()
	calls := settleCalls(t, b.host)
	if len(calls) != 5 || calls[4].token != first[0].token {
		t.Fatalf("unanswered call not resent: %d calls", len(calls))
	}
	b.answerCall(calls[3].id, okFor(t, 1)) // a late answer to a call given up on: ignored
	b.answerCall(calls[4].id, okFor(t, 1))
	for range 5 {
		b.host.now += int64(20 * time.Second)
		b.runTick()
	}
	if n := len(settleCalls(t, b.host)); n != 5 {
		t.Fatalf("an acknowledged batch was sent again: %d calls", n)
	}
	if c := b.host.counters; c[MetricUsageSettled] != 1 || c[MetricUsageSettleCalls] != 1 || c[MetricUsageSettleRetries] != 4 {
		t.Fatalf("counters %v", c)
	}
}

// TestUsageQueueBound: at most queue_max charges wait; one more is lost
// and counted (a charge of a waiting descriptor still merges); at most
// queue_max more are in unacknowledged batches.
func TestUsageQueueBound(t *testing.T) {
	b := newTestbed(t, usageConfig(`{"source": {"response_header": "x-u"}}`,
		`{"batch_max": 2, "interval_ms": 0, "queue_max": 4}`))
	b.host.settleErr = errors.New("UNAVAILABLE") // settle calls cannot be made
	for _, k := range []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "a"} {
		id := b.admit(k, nil)
		b.complete(id, map[string]string{"x-u": "2"}, nil, 0)
	}
	q := b.w.usage.q
	// a-d each in a batch of its own (interval 0): queue_max in batches;
	// e-h wait; i finds the queue full, and so does the second a (its
	// first charge is in a batch, not waiting): both lost.
	if charges, _ := q.InBatches(); charges != 4 || q.Waiting() != 4 || b.host.counters[MetricUsageSettleLost] != 2 {
		t.Fatalf("in batches %d, waiting %d, lost %d", charges, q.Waiting(), b.host.counters[MetricUsageSettleLost])
	}
	id := b.admit("e", nil)
	b.complete(id, map[string]string{"x-u": "3"}, nil, 0)
	e := descriptors.AppendKey(nil, &descriptors.Descriptor{Entries: []descriptors.Entry{{Key: "api_key", Value: "e"}}})
	if c := q.Pending(e); c != 3 || b.host.counters[MetricUsageSettleLost] != 2 {
		t.Fatalf("a charge of a waiting descriptor was not merged: %d", c)
	}
	// The control plane returns: everything left is delivered.
	b.host.settleErr = nil
	for range 10 {
		b.host.now += int64(20 * time.Second)
		b.runTick()
		for _, c := range settleCalls(t, b.host) {
			if b.w.calls.Has(c.id) {
				b.answerCall(c.id, okFor(t, len(c.keys)))
			}
		}
	}
	if charges, _ := q.InBatches(); b.host.counters[MetricUsageSettled] != 8 || charges != 0 || q.Waiting() != 0 {
		t.Fatalf("settled %d, in batches %d, waiting %d", b.host.counters[MetricUsageSettled], charges, q.Waiting())
	}
}

// TestUsageSettleAnswerBlocks: a descriptor a settlement answer says is
// over its limit is refused locally until its reset (less the call
// timeout), in this VM and in another VM of the proxy; probes too; other
// keys are not.
func TestUsageSettleAnswerBlocks(t *testing.T) {
	shared := newSharedData()
	cfg := usageConfig(`{"reserve": 0, "source": {"response_header": "x-u"}}`, perStream)
	b := newTestbedOn(t, cfg, shared)
	other := newTestbedOn(t, cfg, shared)
	id := b.admit("k1", nil)
	b.complete(id, map[string]string{"x-u": "300"}, nil, 0)
	calls := settleCalls(t, b.host)
	b.answerCall(calls[0].id, grpcOK(t, &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{
			Code: rlsv3.RateLimitResponse_OVER_LIMIT, DurationUntilReset: durationpb.New(60 * time.Second)}},
	}))
	req := map[string]string{":method": "POST", ":path": "/", "x-api-key": "k1"}
	for _, tb := range []*testbed{b, other} {
		n := len(tb.host.calls)
		id, a := tb.request(req, "")
		if a != Pause || len(tb.host.calls) != n || tb.host.local[id].status != 429 {
			t.Fatalf("probe of a key over its limit: action %d, calls %d -> %d, local %+v", a, n, len(tb.host.calls), tb.host.local[id])
		}
		if ra, _ := header(tb.host.local[id].headers, "retry-after"); ra != "60" {
			t.Fatalf("retry-after %q, want 60", ra)
		}
	}
	n := len(b.host.calls)
	if _, a := b.request(map[string]string{":method": "POST", ":path": "/", "x-api-key": "k2"}, ""); a != Pause || len(b.host.calls) != n+1 {
		t.Fatalf("another key was not asked")
	}
	b.deliver(okFor(t, 1))
	// Past the reset less the call timeout, the key is asked again.
	b.host.now += int64(60*time.Second - 25*time.Millisecond)
	n = len(b.host.calls)
	if _, a := b.request(req, ""); a != Pause || len(b.host.calls) != n+1 {
		t.Fatalf("the block outlived the reset less the timeout")
	}
}

// TestUsageLostWithThePlugin: charges not yet acknowledged when the plugin
// instance is deleted count as lost.
func TestUsageLostWithThePlugin(t *testing.T) {
	b := newTestbed(t, usageConfig(`{"source": {"response_header": "x-u"}}`, `{"interval_ms": 1000}`))
	for _, k := range []string{"a", "b"} {
		id := b.admit(k, nil)
		b.complete(id, map[string]string{"x-u": "9"}, nil, 0)
	}
	b.w.Stop()
	if b.host.counters[MetricUsageSettleLost] != 2 {
		t.Fatalf("lost %d, want 2", b.host.counters[MetricUsageSettleLost])
	}
}

// TestUsageRefusedBatchIsLost: a batch the control plane refuses as
// malformed (INVALID_ARGUMENT) is not sent again: its charges count as lost.
func TestUsageRefusedBatchIsLost(t *testing.T) {
	b := newTestbed(t, usageConfig(`{"source": {"response_header": "x-u"}}`, perStream))
	id := b.admit("k1", nil)
	b.complete(id, map[string]string{"x-u": "9"}, nil, 0)
	calls := settleCalls(t, b.host)
	b.answerCall(calls[0].id, &fakeAnswer{headers: map[string]string{":status": "200"},
		trailers: map[string]string{"grpc-status": "3", "grpc-message": "bad token"}})
	for range 3 {
		b.host.now += int64(20 * time.Second)
		b.runTick()
	}
	charges, batches := b.w.usage.q.InBatches()
	if n := len(settleCalls(t, b.host)); n != 1 || b.host.counters[MetricUsageSettleLost] != 1 || batches != 0 || charges != 0 {
		t.Fatalf("%d calls, lost %d, %d batches", n, b.host.counters[MetricUsageSettleLost], batches)
	}
}

// TestUsageTickSetOncePerInterval: stream ends that queue charges within
// one interval set the tick period once, not once each.
func TestUsageTickSetOncePerInterval(t *testing.T) {
	b := newTestbed(t, usageConfig(`{"source": {"response_header": "x-u"}}`, `{"interval_ms": 100}`))
	sets := b.host.tickSets
	for i := range 20 {
		id := b.admit("k"+string(rune('a'+i)), nil)
		b.complete(id, map[string]string{"x-u": "5"}, nil, 0)
		b.host.now += int64(4 * time.Millisecond)
	}
	if n := b.host.tickSets - sets; n != 1 || b.host.tick != 100 {
		t.Fatalf("%d tick period changes for 20 stream ends (period %d), want 1 (100)", n, b.host.tick)
	}
	b.host.now += int64(20 * time.Millisecond)
	b.runTick()
	if n := len(settleCalls(t, b.host)); n != 1 {
		t.Fatalf("%d settle calls at the interval, want 1", n)
	}
}

// TestUsageLongKeyIsLost: a charge whose descriptor key is over
// settle.MaxKey bytes is not queued: it is lost and counted.
func TestUsageLongKeyIsLost(t *testing.T) {
	b := newTestbed(t, usageConfig(`{"source": {"response_header": "x-u"}}`, perStream))
	id := b.admit(strings.Repeat("k", settle.MaxKey), nil)
	b.complete(id, map[string]string{"x-u": "9"}, nil, 0)
	if n := len(settleCalls(t, b.host)); n != 0 || b.host.counters[MetricUsageSettleLost] != 1 {
		t.Fatalf("%d settle calls, lost %d", n, b.host.counters[MetricUsageSettleLost])
	}
}
