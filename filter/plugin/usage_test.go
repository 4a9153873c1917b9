package plugin

import (
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/sluicehq/sluice/filter/rlsproto"
)

// usageConfig is a configuration with one usage-based rate limit per API
// key; usage and settle are spliced in.
func usageConfig(usage, settle string) string {
	return `{"cluster": "cp", "domain": "llm", "timeout": "25ms",
	  "rate_limits": [{"actions": [{"request_headers": {"header_name": "x-api-key", "descriptor_key": "api_key"}}],
	    "usage": ` + usage + `}],
	  "settle": ` + settle + `}`
}

// perStream is the settle options that send each settlement in its own
// call at stream end.
const perStream = `{"batch_max": 1, "interval_ms": 0}`

// okFor is the control plane's OK for n descriptors.
func okFor(t testing.TB, n int) *fakeAnswer {
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
	for range n {
		resp.Statuses = append(resp.Statuses, &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK})
	}
	return grpcOK(t, resp)
}

// settleCall is a settle call as the control plane reads it.
type settleCall struct {
	id      uint32
	token   string
	domain  string
	keys    []string // "api_key=k1"
	charges []uint64
	body    []byte
}

// settleCalls returns the settle calls made so far, in order.
func settleCalls(t testing.TB, h *fakeHost) []settleCall {
	t.Helper()
	var out []settleCall
	for _, c := range h.calls {
		token, ok := header(c.headers, rlsproto.SettleHeader)
		if !ok {
			continue
		}
		msg, err := rlsproto.ParseFrame(c.body)
		if err != nil {
			t.Fatal(err)
		}
		var req rlsv3.RateLimitRequest
		if err := proto.Unmarshal(msg, &req); err != nil {
			t.Fatal(err)
		}
		sc := settleCall{id: c.id, token: token, domain: req.Domain, body: c.body}
		if req.HitsAddend != 0 || len(req.ProtoReflect().GetUnknown()) != 0 {
			t.Fatalf("settle call with a request-level hits_addend or a quota marker: %v", &req)
		}
		for _, d := range req.Descriptors {
			var kv []string
			for _, e := range d.Entries {
				kv = append(kv, e.Key+"="+e.Value)
			}
			if d.HitsAddend == nil || d.HitsAddend.Value == 0 {
				t.Fatalf("settle descriptor without a charge: %v", d)
			}
			sc.keys = append(sc.keys, strings.Join(kv, ","))
			sc.charges = append(sc.charges, d.HitsAddend.Value)
		}
		out = append(out, sc)
	}
	return out
}

// answerCall delivers a to call id.
func (b *testbed) answerCall(id uint32, a *fakeAnswer) {
	b.host.answer = a
	b.host.current = rootID
	if a == nil {
		b.vm.OnHTTPCallResponse(rootID, id, 0, 0, 0)
		return
	}
	b.vm.OnHTTPCallResponse(rootID, id, len(a.headers), len(a.body), len(a.trailers))
	b.host.answer = nil
}

// admit sends a request for API key and admits it; it returns the stream.
func (b *testbed) admit(key string, extra map[string]string) uint32 {
	b.t.Helper()
	hs := map[string]string{":method": "POST", ":path": "/v1/chat", "x-api-key": key}
	for k, v := range extra {
		hs[k] = v
	}
	id, a := b.request(hs, "")
	if a != ActionPause {
		b.t.Fatalf("request for %s: action %d", key, a)
	}
	b.deliver(okFor(b.t, 1))
	if b.host.resumed[id] != 1 {
		b.t.Fatalf("request for %s not resumed: %v", key, b.host.logs)
	}
	return id
}

// end ends a stream the way Envoy does: log, done, delete.
func (b *testbed) end(id uint32) {
	b.host.current = id
	b.vm.OnLog(id)
	b.vm.OnDone(id)
	b.vm.OnDelete(id)
}

// complete runs a stream's whole response: headers (with hs), a body of
// n bytes in two chunks, trailers (with ts, when not nil), and its end.
func (b *testbed) complete(id uint32, hs, ts map[string]string, n int) {
	b.host.current = id
	b.host.respHeaders[id], b.host.respTrailers[id] = hs, ts
	b.vm.OnResponseHeaders(id, len(hs), false)
	b.vm.OnResponseBody(id, n/2, false)
	b.vm.OnResponseBody(id, n-n/2, ts == nil)
	if ts != nil {
		b.vm.OnResponseTrailers(id, len(ts))
	}
	b.end(id)
}

func metadataDouble(f float64) []byte {
	return binary.LittleEndian.AppendUint64(nil, math.Float64bits(f))
}

// TestUsageCostSources: the actual cost is read from each source; the
// charge settled is the actual cost less the reserve (1), sent at stream
// end in its own call with batch_max 1 and interval_ms 0.
func TestUsageCostSources(t *testing.T) {
	mdPath := "metadata\x00filter_metadata\x00io.envoy.ai_gateway\x00llm_total_token"
	tests := []struct {
		name, source string
		hs, ts       map[string]string
		md           []byte
		want         uint64
	}{
		{"header", `{"response_header": "X-Usage-Tokens"}`, map[string]string{"x-usage-tokens": "100"}, nil, nil, 99},
		{"trailer", `{"response_trailer": "x-usage-tokens"}`, map[string]string{}, map[string]string{"x-usage-tokens": " 250 "}, nil, 249},
		{"metadata double", `{"dynamic_metadata": {"namespace": "io.envoy.ai_gateway", "key": "llm_total_token"}}`, map[string]string{}, nil, metadataDouble(42), 41},
		{"metadata digits", `{"dynamic_metadata": {"namespace": "io.envoy.ai_gateway", "key": "llm_total_token"}}`, map[string]string{}, nil, []byte("12345678"), 12345677},
		{"body bytes", `{"response_body_bytes": {}}`, map[string]string{}, nil, nil, 1499},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newTestbed(t, usageConfig(`{"source": `+tt.source+`}`, perStream))
			id := b.admit("k1", nil)
			if tt.md != nil {
				b.host.props[id] = map[string][]byte{mdPath: tt.md}
			}
			b.complete(id, tt.hs, tt.ts, 1500)
			calls := settleCalls(t, b.host)
			if len(calls) != 1 || calls[0].domain != "llm" || len(calls[0].keys) != 1 ||
				calls[0].keys[0] != "api_key=k1" || calls[0].charges[0] != tt.want {
				t.Fatalf("settle calls %+v, want one charging api_key=k1 %d", calls, tt.want)
			}
			if b.host.counters[MetricUsageMissing] != 0 || b.host.counters[MetricUsageDisconnects] != 0 {
				t.Fatalf("counters %v", b.host.counters)
			}
		})
	}
}

// TestUsageMissingValue: a missing or malformed value is charged as
// "missing" says, and counted.
func TestUsageMissingValue(t *testing.T) {
	tests := []struct {
		name, missing string
		hs            map[string]string
		want          uint64 // 0: no settlement
	}{
		{"absent reserve", `"reserve"`, map[string]string{}, 0},
		{"malformed zero", `"zero"`, map[string]string{"x-usage-tokens": "12abc"}, 0},
		{"negative number", `50`, map[string]string{"x-usage-tokens": "-5"}, 49},
		{"too large number", `50`, map[string]string{"x-usage-tokens": "99999999999999999999"}, 49},
		{"absent number", `50`, map[string]string{}, 49},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newTestbed(t, usageConfig(`{"source": {"response_header": "x-usage-tokens"}, "missing": `+tt.missing+`}`, perStream))
			id := b.admit("k1", nil)
			b.complete(id, tt.hs, nil, 10)
			calls := settleCalls(t, b.host)
			if tt.want == 0 && len(calls) != 0 || tt.want != 0 && (len(calls) != 1 || calls[0].charges[0] != tt.want) {
				t.Fatalf("settle calls %+v, want charge %d", calls, tt.want)
			}
			if b.host.counters[MetricUsageMissing] != 1 {
				t.Fatalf("usage_missing %d, want 1", b.host.counters[MetricUsageMissing])
			}
		})
	}
}

// TestUsageDisconnect: a stream that ends before its response did is
// charged per on_disconnect (its reserve: nothing more; or the body bytes
// sent so far) and counted, and leaves no state behind.
func TestUsageDisconnect(t *testing.T) {
	for _, tt := range []struct {
		mode string
		want uint64
	}{{"reserve", 0}, {"bytes", 699}} {
		t.Run(tt.mode, func(t *testing.T) {
			b := newTestbed(t, usageConfig(`{"source": {"response_trailer": "x-usage-tokens"}, "on_disconnect": "`+tt.mode+`"}`, perStream))
			id := b.admit("k1", nil)
			b.host.current = id
			b.host.respHeaders[id] = map[string]string{}
			b.vm.OnResponseHeaders(id, 0, false)
			b.vm.OnResponseBody(id, 300, false)
			b.vm.OnResponseBody(id, 400, false)
			b.end(id) // no end of stream, no trailers: the client went away
			calls := settleCalls(t, b.host)
			if tt.want == 0 && len(calls) != 0 || tt.want != 0 && (len(calls) != 1 || calls[0].charges[0] != tt.want) {
				t.Fatalf("settle calls %+v, want charge %d", calls, tt.want)
			}
			if b.host.counters[MetricUsageDisconnects] != 1 || b.host.counters[MetricUsageMissing] != 0 {
				t.Fatalf("counters %v", b.host.counters)
			}
			if b.vm.streams.len() != 0 {
				t.Fatalf("%d streams left", b.vm.streams.len())
			}
			// The stream is reused, clean: a request that is then refused
			// settles nothing.
			hs := map[string]string{":method": "POST", ":path": "/", "x-api-key": "k2"}
			id2, _ := b.request(hs, "")
			if b.vm.free != nil && len(b.vm.free) != 0 {
				t.Fatalf("the stream was not reused")
			}
			b.deliver(overLimitAnswer(t, 1000))
			b.end(id2)
			if n := len(settleCalls(t, b.host)); n != len(calls) {
				t.Fatalf("a refused request settled: %d calls", n)
			}
		})
	}
}

// TestUsageRequestCost: the request-time cost is the reserve, or the
// request header's value when valid; a reserve of 0 is a probe: a
// per-descriptor hits_addend 0. A usage-based request asks for no quotas.
func TestUsageRequestCost(t *testing.T) {
	b := newTestbed(t, usageConfig(`{"reserve": 0, "source": {"response_header": "x-t"}, "request_header": "x-request-cost"}`, perStream))
	cost := func(extra map[string]string) (uint64, bool) {
		hs := map[string]string{":method": "POST", ":path": "/", "x-api-key": "k1"}
		for k, v := range extra {
			hs[k] = v
		}
		id, a := b.request(hs, "")
		if a != ActionPause {
			t.Fatalf("action %d", a)
		}
		msg, err := rlsproto.ParseFrame(b.host.calls[len(b.host.calls)-1].body)
		if err != nil {
			t.Fatal(err)
		}
		var req rlsv3.RateLimitRequest
		if err := proto.Unmarshal(msg, &req); err != nil {
			t.Fatal(err)
		}
		if len(req.ProtoReflect().GetUnknown()) != 0 {
			t.Fatalf("a usage-based request asked for quotas")
		}
		b.deliver(okFor(t, 1))
		b.end(id)
		d := req.Descriptors[0]
		if d.HitsAddend == nil {
			return uint64(req.HitsAddend), false
		}
		return d.HitsAddend.Value, true
	}
	if c, own := cost(nil); c != 0 || !own {
		t.Fatalf("probe: cost %d (own %v), want a per-descriptor 0", c, own)
	}
	if c, _ := cost(map[string]string{"x-request-cost": "40"}); c != 40 {
		t.Fatalf("request header: cost %d, want 40", c)
	}
	if c, own := cost(map[string]string{"x-request-cost": "forty"}); c != 0 || !own {
		t.Fatalf("invalid request header: cost %d, want the reserve 0", c)
	}
}

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
	b.vm.OnTick(rootID)
	if n := len(settleCalls(t, b.host)); n != 2 {
		t.Fatalf("e sent before its interval: %d calls", n)
	}
	b.host.now += int64(time.Millisecond)
	b.vm.OnTick(rootID)
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
	st := &b.vm.roots[0].settle
	if len(st.pending) != 0 || len(st.index) != 0 || len(st.batches) != 0 || len(st.calls) != 0 || st.inBatches != 0 {
		t.Fatalf("settler not empty: %+v", st)
	}
	b.vm.OnTick(rootID)
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
		b.vm.OnTick(rootID) // too early: backing off
		if n := len(settleCalls(t, b.host)); n != i+1 {
			t.Fatalf("failure %d: resent without backing off (%d calls)", i, n)
		}
		b.host.now += int64(20 * time.Second)
		b.vm.OnTick(rootID)
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
	b.vm.OnTick(rootID)
	b.host.now += int64(20 * time.Second)
	b.vm.OnTick(rootID)
	calls := settleCalls(t, b.host)
	if len(calls) != 5 || calls[4].token != first[0].token {
		t.Fatalf("unanswered call not resent: %d calls", len(calls))
	}
	b.answerCall(calls[3].id, okFor(t, 1)) // a late answer to a call given up on: ignored
	b.answerCall(calls[4].id, okFor(t, 1))
	for range 5 {
		b.host.now += int64(20 * time.Second)
		b.vm.OnTick(rootID)
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
	st := &b.vm.roots[0].settle
	// a-d each in a batch of its own (interval 0): queue_max in batches;
	// e-h wait; i finds the queue full, and so does the second a (its
	// first charge is in a batch, not waiting): both lost.
	if st.inBatches != 4 || len(st.pending) != 4 || b.host.counters[MetricUsageSettleLost] != 2 {
		t.Fatalf("in batches %d, waiting %d, lost %d", st.inBatches, len(st.pending), b.host.counters[MetricUsageSettleLost])
	}
	id := b.admit("e", nil)
	b.complete(id, map[string]string{"x-u": "3"}, nil, 0)
	if st.pending[0].charge != 3 || b.host.counters[MetricUsageSettleLost] != 2 {
		t.Fatalf("a charge of a waiting descriptor was not merged: %+v", st.pending[0])
	}
	// The control plane returns: everything left is delivered.
	b.host.settleErr = nil
	for range 10 {
		b.host.now += int64(20 * time.Second)
		b.vm.OnTick(rootID)
		for _, c := range settleCalls(t, b.host) {
			if st.owns(c.id) {
				b.answerCall(c.id, okFor(t, len(c.keys)))
			}
		}
	}
	if b.host.counters[MetricUsageSettled] != 8 || st.inBatches != 0 || len(st.pending) != 0 {
		t.Fatalf("settled %d, in batches %d, waiting %d", b.host.counters[MetricUsageSettled], st.inBatches, len(st.pending))
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
		if a != ActionPause || len(tb.host.calls) != n || tb.host.local[id].status != 429 {
			t.Fatalf("probe of a key over its limit: action %d, calls %d -> %d, local %+v", a, n, len(tb.host.calls), tb.host.local[id])
		}
		if ra, _ := header(tb.host.local[id].headers, "retry-after"); ra != "60" {
			t.Fatalf("retry-after %q, want 60", ra)
		}
	}
	n := len(b.host.calls)
	if _, a := b.request(map[string]string{":method": "POST", ":path": "/", "x-api-key": "k2"}, ""); a != ActionPause || len(b.host.calls) != n+1 {
		t.Fatalf("another key was not asked")
	}
	b.deliver(okFor(t, 1))
	// Past the reset less the call timeout, the key is asked again.
	b.host.now += int64(60*time.Second - 25*time.Millisecond)
	n = len(b.host.calls)
	if _, a := b.request(req, ""); a != ActionPause || len(b.host.calls) != n+1 {
		t.Fatalf("the block outlived the reset less the timeout")
	}
}

// TestUsageFailOpenChargesAll: a request the failure mode let through ran
// without its reserve charged: its whole actual cost is settled.
func TestUsageFailOpenChargesAll(t *testing.T) {
	b := newTestbed(t, usageConfig(`{"reserve": 5, "source": {"response_header": "x-u"}}`, perStream))
	id, _ := b.request(map[string]string{":method": "POST", ":path": "/", "x-api-key": "k1"}, "")
	b.deliver(nil) // no answer: fail open
	if b.host.resumed[id] != 1 {
		t.Fatalf("not failed open")
	}
	b.complete(id, map[string]string{"x-u": "100"}, nil, 0)
	if calls := settleCalls(t, b.host); len(calls) != 1 || calls[0].charges[0] != 100 {
		t.Fatalf("settle calls %+v, want 100", calls)
	}
	// The same when the check cannot even be sent.
	b.host.callErr = errors.New("BAD_ARGUMENT")
	id, a := b.request(map[string]string{":method": "POST", ":path": "/", "x-api-key": "k2"}, "")
	b.host.callErr = nil
	if a != ActionContinue {
		t.Fatalf("not failed open: action %d", a)
	}
	b.complete(id, map[string]string{"x-u": "70"}, nil, 0)
	if calls := settleCalls(t, b.host); len(calls) != 2 || calls[1].charges[0] != 70 {
		t.Fatalf("settle calls %+v, want 70", calls)
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
	b.vm.OnDelete(rootID)
	if b.host.counters[MetricUsageSettleLost] != 2 {
		t.Fatalf("lost %d, want 2", b.host.counters[MetricUsageSettleLost])
	}
}

// TestUsageNoLeases: a usage-based descriptor never spends a lease: a
// quota in its answer is not kept, and the next request calls out.
func TestUsageNoLeases(t *testing.T) {
	b := newTestbed(t, usageConfig(`{"source": {"response_header": "x-u"}}`, perStream))
	req := map[string]string{":method": "POST", ":path": "/", "x-api-key": "k1"}
	id, _ := b.request(req, "")
	b.deliver(grpcOK(t, &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{
			Code: rlsv3.RateLimitResponse_OK,
			Quota: &rlsv3.RateLimitResponse_Quota{Requests: 100, ExpirationSpecifier: &rlsv3.RateLimitResponse_Quota_ValidUntil{
				ValidUntil: timestamppb.New(time.Unix(0, b.host.WallNow()+int64(time.Minute)))}},
		}},
	}))
	b.end(id)
	n := len(b.host.calls)
	if _, a := b.request(req, ""); a != ActionPause || len(b.host.calls) != n+1 || b.host.counters[MetricQuotaAllowed] != 0 {
		t.Fatalf("a usage-based request was admitted from a lease")
	}
}

// TestUsageConfigRefused: a bad usage or settle object refuses the
// configuration, naming the field.
func TestUsageConfigRefused(t *testing.T) {
	for _, c := range []struct{ cfg, field string }{
		{usageConfig(`{"source": {"response_header": "x"}, "reserve": -1}`, perStream), "rate_limits[0].usage.reserve"},
		{usageConfig(`{"source": {"response_header": "x"}}`, `{"batch_max": 65}`), "settle.batch_max"},
	} {
		h := newFakeHost(t, c.cfg)
		vm := NewVM(h)
		vm.OnContextCreate(rootID, 0)
		if vm.OnConfigure(rootID, len(c.cfg)) || !h.logged(c.field) {
			t.Fatalf("%s: configuration accepted or field not named: %v", c.field, h.logs)
		}
	}
}

// TestUsageHeadersInTokens: the RateLimit headers of a usage-based limit
// are in the policy's unit: a probe's answer carries the true remaining
// (tokens), and a local 429 on a settlement's block says the limit, 0
// remaining and the Retry-After until the reset.
func TestUsageHeadersInTokens(t *testing.T) {
	b := newTestbed(t, usageConfig(`{"reserve": 0, "source": {"response_header": "x-usage-tokens"}}`, perStream))
	limit := map[string]any{"algorithm": "fixed_window", "limit": 250, "window_ms": 60000, "name": "tokens"}
	id, _ := b.request(map[string]string{":method": "POST", ":path": "/", "x-api-key": "k1"}, "")
	b.deliver(grpcOK(t, &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: 150,
			DurationUntilReset: durationpb.New(40 * time.Second)}},
		DynamicMetadata: metadata(t, limit),
	}))
	b.complete(id, map[string]string{"x-usage-tokens": "100"}, nil, 0)
	pol, _ := header(b.host.addedRsp[id], "ratelimit-policy")
	rl, _ := header(b.host.addedRsp[id], "ratelimit")
	if pol != `"tokens";q=250;w=60` || rl != `"tokens";r=150;t=40` {
		t.Fatalf("headers %q, %q", pol, rl)
	}
	calls := settleCalls(t, b.host)
	if len(calls) != 1 || calls[0].charges[0] != 100 {
		t.Fatalf("settle calls %+v, want the probe's whole usage, 100", calls)
	}
	over := map[string]any{"algorithm": "fixed_window", "limit": 250, "window_ms": 60000, "name": "tokens", "retry_after_ms": 30000}
	b.answerCall(calls[0].id, grpcOK(t, &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OVER_LIMIT,
			DurationUntilReset: durationpb.New(30 * time.Second)}},
		DynamicMetadata: metadata(t, over),
	}))
	id, _ = b.request(map[string]string{":method": "POST", ":path": "/", "x-api-key": "k1"}, "")
	l := b.host.local[id]
	pol, _ = header(l.headers, "ratelimit-policy")
	rl, _ = header(l.headers, "ratelimit")
	ra, _ := header(l.headers, "retry-after")
	if l.status != 429 || pol != `"tokens";q=250;w=60` || rl != `"tokens";r=0;t=30` || ra != "30" {
		t.Fatalf("local reply %+v", l)
	}
}
