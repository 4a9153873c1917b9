package core

import (
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/sluicehq/sluice/filter/core/rlsproto"
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
	charges []int64  // a refund is negative
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
		req := sentRequest(t, c.body)
		sc := settleCall{id: c.id, token: token, domain: req.Domain, body: c.body}
		if req.HitsAddend != 0 || len(req.ProtoReflect().GetUnknown()) != 0 {
			t.Fatalf("settle call with a request-level hits_addend or a quota marker: %v", req)
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
			amount := int64(d.HitsAddend.Value)
			if d.IsNegativeHits {
				amount = -amount
			}
			sc.charges = append(sc.charges, amount)
		}
		out = append(out, sc)
	}
	return out
}

// admit sends a request for API key and admits it; it returns the stream.
func (b *testbed) admit(key string, extra map[string]string) uint32 {
	b.t.Helper()
	hs := map[string]string{":method": "POST", ":path": "/v1/chat", "x-api-key": key}
	for k, v := range extra {
		hs[k] = v
	}
	id, a := b.request(hs, "")
	if a != Pause {
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
	b.ended(id)
	b.ended(id)
	b.close(id)
}

// complete runs a stream's whole response: headers (with hs), a body of
// n bytes in two chunks, trailers (with ts, when not nil), and its end.
func (b *testbed) complete(id uint32, hs, ts map[string]string, n int) {
	b.host.respHeaders[id], b.host.respTrailers[id] = hs, ts
	b.responseHeaders(id, false)
	b.responseBody(id, n/2, false)
	b.responseBody(id, n-n/2, ts == nil)
	if ts != nil {
		b.responseTrailers(id)
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
		want         int64
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
		want          int64 // 0: no settlement
	}{
		{"absent reserve", `"reserve"`, map[string]string{}, 0},
		{"malformed zero", `"zero"`, map[string]string{"x-usage-tokens": "12abc"}, -1}, // the reserve (1) refunded
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
		want int64
	}{{"reserve", 0}, {"bytes", 699}} {
		t.Run(tt.mode, func(t *testing.T) {
			b := newTestbed(t, usageConfig(`{"source": {"response_trailer": "x-usage-tokens"}, "on_disconnect": "`+tt.mode+`"}`, perStream))
			id := b.admit("k1", nil)
			b.host.respHeaders[id] = map[string]string{}
			b.responseHeaders(id, false)
			b.responseBody(id, 300, false)
			b.responseBody(id, 400, false)
			b.end(id) // no end of stream, no trailers: the client went away
			calls := settleCalls(t, b.host)
			if tt.want == 0 && len(calls) != 0 || tt.want != 0 && (len(calls) != 1 || calls[0].charges[0] != tt.want) {
				t.Fatalf("settle calls %+v, want charge %d", calls, tt.want)
			}
			if b.host.counters[MetricUsageDisconnects] != 1 || b.host.counters[MetricUsageMissing] != 0 {
				t.Fatalf("counters %v", b.host.counters)
			}
			if len(b.streams) != 0 {
				t.Fatalf("%d streams left", len(b.streams))
			}
			// The stream is reused, clean: a request that is then refused
			// settles nothing.
			hs := map[string]string{":method": "POST", ":path": "/", "x-api-key": "k2"}
			id2, _ := b.request(hs, "")
			if len(b.w.exchanges.free) != 0 {
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
		if a != Pause {
			t.Fatalf("action %d", a)
		}
		req := sentRequest(t, b.host.calls[len(b.host.calls)-1].body)
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
	if a != Continue {
		t.Fatalf("not failed open: action %d", a)
	}
	b.complete(id, map[string]string{"x-u": "70"}, nil, 0)
	if calls := settleCalls(t, b.host); len(calls) != 2 || calls[1].charges[0] != 70 {
		t.Fatalf("settle calls %+v, want 70", calls)
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
	if _, a := b.request(req, ""); a != Pause || len(b.host.calls) != n+1 || b.host.counters[MetricQuotaAllowed] != 0 {
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
		if NewWorker(h).Configure([]byte(c.cfg)) || !h.logged(c.field) {
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
