package core

import (
	"fmt"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

const holdConfig = `{"cluster": "cp", "domain": "shaping", "max_held": 3,
  "rate_limits": [{"actions": [{"remote_address": {}}]}]}`

// reserveAnswer is an OK answer whose one descriptor must wait waitMs.
func reserveAnswer(t testing.TB, waitMs float64) *fakeAnswer {
	meta := map[string]any{"algorithm": "reserve", "limit": 10, "window_ms": 1000, "burst": 5}
	if waitMs > 0 {
		meta["wait_ms"] = waitMs
	}
	return grpcOK(t, &rlsv3.RateLimitResponse{
		OverallCode:     rlsv3.RateLimitResponse_OK,
		Statuses:        []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OK}},
		DynamicMetadata: metadata(t, meta),
	})
}

// held sends a request and answers it with a wait; it returns the stream.
func (b *testbed) held(waitMs float64) uint32 {
	b.t.Helper()
	id, action := b.request(map[string]string{":path": "/"}, "10.0.0.1:1")
	if action != Pause {
		b.t.Fatalf("action %d", action)
	}
	b.deliver(reserveAnswer(b.t, waitMs))
	return id
}

// tick advances the clock by d and runs proxy_on_tick.
func (b *testbed) tick(d time.Duration) {
	b.host.now += int64(d)
	b.runTick()
}

func TestHoldReleasesInOrder(t *testing.T) {
	b := newTestbed(t, holdConfig)
	h := b.host
	a := b.held(300)
	if h.resumed[a] != 0 || h.tick != 300 || h.counters[MetricHeld] != 1 {
		t.Fatalf("held a: resumed %d, tick %d, counters %v", h.resumed[a], h.tick, h.counters)
	}
	h.now += int64(10 * time.Millisecond)
	bb := b.held(90.5) // due at 100.5 ms: before a, so the tick comes sooner
	c := b.held(90.5)  // due at the same time: after bb
	if h.tick != 91 || h.counters[MetricHeld] != 3 {
		t.Fatalf("tick %d, counters %v", h.tick, h.counters)
	}
	b.tick(90 * time.Millisecond) // 100 ms after the start: nothing due before 100.5
	if len(h.order) != 0 || h.tick != 1 {
		t.Fatalf("resumed %v early; tick %d", h.order, h.tick)
	}
	b.tick(time.Millisecond)
	if fmt.Sprint(h.order) != fmt.Sprint([]uint32{bb, c}) || h.tick != 199 || h.counters[MetricHeld] != 1 {
		t.Fatalf("resumed %v (want %d %d), tick %d, counters %v", h.order, bb, c, h.tick, h.counters)
	}
	if got := h.addedReq[bb]; len(got) != 1 || got[0] != [2]string{HeaderDelayed, "91"} {
		t.Errorf("request headers of bb: %v", got)
	}
	b.tick(198 * time.Millisecond)
	if len(h.order) != 2 {
		t.Fatalf("a resumed early: %v", h.order)
	}
	b.tick(time.Millisecond)
	if fmt.Sprint(h.order) != fmt.Sprint([]uint32{bb, c, a}) || h.tick != tickPeriodMs {
		t.Fatalf("resumed %v, tick %d", h.order, h.tick)
	}
	if got := h.addedReq[a]; len(got) != 1 || got[0] != [2]string{HeaderDelayed, "300"} {
		t.Errorf("request headers of a: %v", got)
	}
	if h.counters[MetricHeld] != 0 || h.counters[MetricDelayed] != 3 || h.counters[MetricDelayedMs] != 91+91+300 ||
		h.counters[MetricAllowed] != 3 {
		t.Errorf("counters %v", h.counters)
	}
	for _, id := range []uint32{a, bb, c} {
		b.respond(id)
	}
	if len(b.w.exchanges.free) != 3 || len(b.streams) != 0 {
		t.Errorf("streams not returned: %d free, %d live", len(b.w.exchanges.free), len(b.streams))
	}
}

func TestHoldBound(t *testing.T) {
	b := newTestbed(t, holdConfig)
	h := b.host
	for range 3 {
		b.held(50)
	}
	over := b.held(50)
	l, ok := h.local[over]
	if !ok || l.status != 429 || l.details != DetailsHoldFull || h.resumed[over] != 0 {
		t.Fatalf("beyond max_held: %+v %v", l, ok)
	}
	if h.counters[MetricHoldRejected] != 1 || h.counters[MetricHeld] != 3 {
		t.Fatalf("counters %v", h.counters)
	}
	// Waits of 0 are not held, whatever the bound.
	id, _ := b.request(map[string]string{":path": "/"}, "10.0.0.1:1")
	b.deliver(reserveAnswer(t, 0))
	if h.resumed[id] != 1 {
		t.Fatalf("an answer without a wait was held")
	}
	b.tick(50 * time.Millisecond)
	if len(h.order) != 4 || h.counters[MetricHeld] != 0 {
		t.Fatalf("resumed %v, counters %v", h.order, h.counters)
	}
}

// TestHoldClientGone: a held request whose client goes away (the proxy
// deletes its context) is dropped at once, never resumed, and its stream
// is reused.
func TestHoldClientGone(t *testing.T) {
	b := newTestbed(t, holdConfig)
	h := b.host
	a := b.held(100)
	gone := b.held(100)
	c := b.held(200)
	b.ended(gone)
	b.close(gone)
	if h.counters[MetricHeld] != 2 || h.counters[MetricHoldAbandon] != 1 || len(b.w.exchanges.free) != 1 {
		t.Fatalf("counters %v, %d free", h.counters, len(b.w.exchanges.free))
	}
	b.tick(100 * time.Millisecond)
	if fmt.Sprint(h.order) != fmt.Sprint([]uint32{a}) {
		t.Fatalf("resumed %v", h.order)
	}
	// The last held one goes away too: nothing is left, the tick slows down
	// at its next run.
	b.close(c)
	b.tick(time.Millisecond)
	p := &b.w.shaping
	if len(p.held) != 0 || h.counters[MetricHeld] != 0 || h.tick != tickPeriodMs || len(h.order) != 1 {
		t.Fatalf("held %d, counters %v, tick %d, resumed %v", len(p.held), h.counters, h.tick, h.order)
	}
}

// TestDelayedHeader: with headers.delayed the client's response says how
// long its request was held; without it only the upstream hears of it.
func TestDelayedHeader(t *testing.T) {
	for _, on := range []bool{false, true} {
		cfg := holdConfig
		if on {
			cfg = `{"cluster": "cp", "domain": "shaping", "max_held": 3, "headers": {"delayed": true},
  "rate_limits": [{"actions": [{"remote_address": {}}]}]}`
		}
		b := newTestbed(t, cfg)
		id := b.held(120)
		b.tick(120 * time.Millisecond)
		b.respond(id)
		var got []string
		for _, h := range b.host.addedRsp[id] {
			if h[0] == HeaderDelayed {
				got = append(got, h[1])
			}
		}
		want := ""
		if on {
			want = "120"
		}
		if fmt.Sprint(got) != fmt.Sprint(strings.Fields(want)) {
			t.Errorf("headers.delayed %v: response %s = %q, want %q", on, HeaderDelayed, got, want)
		}
	}
}
