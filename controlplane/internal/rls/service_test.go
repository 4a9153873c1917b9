package rls

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/policy"
	"github.com/sluicehq/sluice/controlplane/store"
	"github.com/sluicehq/sluice/controlplane/store/memory"
)

const testPolicy = `
domain: test
response_headers: true
descriptors:
  - key: user
    rate_limit: {name: per_user, unit: minute, requests_per_unit: 3}
  - key: api
    value: "v1*"
    rate_limits:
      - {algorithm: token_bucket, unit: second, requests_per_unit: 1, burst: 2}
      - {algorithm: sliding_log, window: 10s, requests_per_unit: 3}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: free
    rate_limit: {unlimited: true}
  - key: org
    descriptors:
      - key: team
        rate_limit: {name: team, unit: hour, requests_per_unit: 2}
  - key: strict
    failure_mode: closed
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: gcra
    rate_limit: {algorithm: gcra, window: 30s, requests_per_unit: 30, burst: 2}
  - key: broad
    rate_limit: {name: broad, unit: minute, requests_per_unit: 1}
  - key: narrow
    rate_limit:
      name: narrow
      unit: minute
      requests_per_unit: 100
      replaces: [{name: broad}]
`

const quietPolicy = `
domain: quiet
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
`

// epoch is a minute (and hour) boundary, so fixed windows reset in whole
// units from it.
var epoch = time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)

type clock struct{ ns atomic.Int64 }

func (c *clock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

func parse(t testing.TB, docs ...string) *policy.Set {
	t.Helper()
	var ds []*policy.Domain
	for i, doc := range docs {
		d, err := policy.Parse(fmt.Sprintf("doc%d", i), []byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, d)
	}
	set, err := policy.NewSet(ds...)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

type fixture struct {
	svc   *Service
	clock *clock
	reg   *prometheus.Registry
}

func newFixture(t testing.TB, st store.Store) *fixture {
	t.Helper()
	c := &clock{}
	c.ns.Store(epoch.UnixNano())
	if st == nil {
		st = memory.New(memory.Options{Now: c.Now})
	}
	reg := prometheus.NewRegistry()
	svc, err := New(st, parse(t, testPolicy, quietPolicy), Options{Logger: quiet, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{svc: svc, clock: c, reg: reg}
}

// desc builds a descriptor from "key=value" pairs.
func desc(pairs ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for _, p := range pairs {
		k, v, _ := strings.Cut(p, "=")
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	return d
}

func req(domain string, ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds}
}

func (f *fixture) call(t *testing.T, r *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := f.svc.ShouldRateLimit(context.Background(), r)
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	if len(resp.Statuses) != len(r.Descriptors) {
		t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(r.Descriptors))
	}
	return resp
}

// want describes one expected descriptor status; a nil limit means no
// current_limit.
type want struct {
	code      rlsv3.RateLimitResponse_Code
	remaining uint32
	reset     time.Duration
	limit     *rlsv3.RateLimitResponse_RateLimit
}

const (
	ok   = rlsv3.RateLimitResponse_OK
	over = rlsv3.RateLimitResponse_OVER_LIMIT
)

func rl(name string, rpu uint32, unit rlsv3.RateLimitResponse_RateLimit_Unit, mult uint32) *rlsv3.RateLimitResponse_RateLimit {
	r := &rlsv3.RateLimitResponse_RateLimit{Name: name, RequestsPerUnit: rpu, Unit: unit}
	if mult > 1 {
		r.UnitMultiplier = wrapperspb.UInt32(mult)
	}
	return r
}

func check(t *testing.T, step string, resp *rlsv3.RateLimitResponse, overall rlsv3.RateLimitResponse_Code, ws ...want) {
	t.Helper()
	if resp.OverallCode != overall {
		t.Errorf("%s: overall %v, want %v", step, resp.OverallCode, overall)
	}
	for i, w := range ws {
		st := resp.Statuses[i]
		got := fmt.Sprintf("code=%v remaining=%d reset=%v limit=%v", st.Code, st.LimitRemaining, st.DurationUntilReset.AsDuration(), fmtLimit(st.CurrentLimit))
		exp := fmt.Sprintf("code=%v remaining=%d reset=%v limit=%v", w.code, w.remaining, w.reset, fmtLimit(w.limit))
		if got != exp {
			t.Errorf("%s: status[%d]\n got %s\nwant %s", step, i, got, exp)
		}
		if w.limit == nil && st.DurationUntilReset != nil {
			t.Errorf("%s: status[%d] has a duration without a limit", step, i)
		}
	}
}

func fmtLimit(r *rlsv3.RateLimitResponse_RateLimit) string {
	if r == nil {
		return "none"
	}
	return fmt.Sprintf("{%q %d %v x%d}", r.Name, r.RequestsPerUnit, r.Unit, r.GetUnitMultiplier().GetValue())
}

var (
	perUser  = rl("per_user", 3, rlsv3.RateLimitResponse_RateLimit_MINUTE, 1)
	apiLog   = rl("", 3, rlsv3.RateLimitResponse_RateLimit_SECOND, 10)
	apiTB    = rl("", 1, rlsv3.RateLimitResponse_RateLimit_SECOND, 1)
	shadowRL = rl("", 1, rlsv3.RateLimitResponse_RateLimit_SECOND, 1)
)

func TestFixedWindow(t *testing.T) {
	f := newFixture(t, nil)
	for i, rem := range []uint32{2, 1, 0} {
		check(t, fmt.Sprint("hit ", i), f.call(t, req("test", desc("user=alice"))), ok, want{ok, rem, time.Minute, perUser})
	}
	f.clock.Advance(15 * time.Second)
	check(t, "over", f.call(t, req("test", desc("user=alice"))), over, want{over, 0, 45 * time.Second, perUser})
	// Another user has their own counter; a denied request took nothing.
	check(t, "bob", f.call(t, req("test", desc("user=bob"))), ok, want{ok, 2, 45 * time.Second, perUser})
	f.clock.Advance(45 * time.Second)
	check(t, "next window", f.call(t, req("test", desc("user=alice"))), ok, want{ok, 2, time.Minute, perUser})
}

func TestUnknownAndUnlimited(t *testing.T) {
	f := newFixture(t, nil)
	resp := f.call(t, req("nope", desc("user=alice"), desc("x=y")))
	check(t, "unknown domain", resp, ok, want{code: ok}, want{code: ok})
	resp = f.call(t, req("test", desc("nobody=x"), desc("free=x"), desc("org=acme"), desc("user=a", "extra=b"), desc()))
	check(t, "unknown descriptors", resp, ok,
		want{code: ok}, want{code: ok, remaining: math.MaxUint32}, want{code: ok}, want{code: ok}, want{code: ok})
	if resp.ResponseHeadersToAdd != nil {
		t.Errorf("headers without any limit: %v", resp.ResponseHeadersToAdd)
	}
}

func TestNestedAndWildcard(t *testing.T) {
	f := newFixture(t, nil)
	team := rl("team", 2, rlsv3.RateLimitResponse_RateLimit_HOUR, 1)
	check(t, "team 1", f.call(t, req("test", desc("org=acme", "team=a"))), ok, want{ok, 1, time.Hour, team})
	check(t, "other org", f.call(t, req("test", desc("org=other", "team=a"))), ok, want{ok, 1, time.Hour, team})
	check(t, "team 2", f.call(t, req("test", desc("org=acme", "team=a"))), ok, want{ok, 0, time.Hour, team})
	check(t, "team 3", f.call(t, req("test", desc("org=acme", "team=a"))), over, want{over, 0, time.Hour, team})
	check(t, "no wildcard match", f.call(t, req("test", desc("api=v2/x"))), ok, want{code: ok})
}

// TestSeveralLimits: a descriptor with a token bucket (burst 2, 1/s) and a
// sliding log (3 per 10 s): all must pass, and the status reports the most
// restrictive. Limits are counted independently (as envoyproxy/ratelimit
// counts descriptors), so a request one limit denies still counts in another.
func TestSeveralLimits(t *testing.T) {
	f := newFixture(t, nil)
	api := func() *rlsv3.RateLimitResponse { return f.call(t, req("test", desc("api=v1/users"))) }
	check(t, "hit 1", api(), ok, want{ok, 1, time.Second, apiTB}) // bucket 1 of 2 left, log 2 of 3
	check(t, "hit 2", api(), ok, want{ok, 0, 2 * time.Second, apiTB})
	check(t, "bucket empty", api(), over, want{over, 0, time.Second, apiTB}) // the log took it
	f.clock.Advance(time.Second)
	check(t, "log full", api(), over, want{over, 0, 9 * time.Second, apiLog}) // the bucket took it
	f.clock.Advance(9 * time.Second)
	check(t, "log emptied", api(), ok, want{ok, 1, time.Second, apiTB})
}

func TestShadowMode(t *testing.T) {
	f := newFixture(t, nil)
	check(t, "first", f.call(t, req("test", desc("shadow=x"))), ok, want{ok, 0, time.Second, shadowRL})
	resp := f.call(t, req("test", desc("shadow=x"), desc("user=a")))
	check(t, "over in shadow", resp, ok, want{ok, 0, time.Second, shadowRL}, want{ok, 2, time.Minute, perUser})
	if got := value(t, f.svc.Metrics().ShadowOverLimit.WithLabelValues("test")); got != 1 {
		t.Errorf("shadow over-limit counter %v, want 1", got)
	}
	if got := value(t, f.svc.Metrics().OverLimit.WithLabelValues("test")); got != 0 {
		t.Errorf("over-limit counter %v, want 0", got)
	}
	// Not advertised in headers, not prechecked by the filter.
	for _, h := range resp.ResponseHeadersToAdd {
		if strings.Contains(h.Value, "shadow") {
			t.Errorf("shadow limit advertised: %s: %s", h.Key, h.Value)
		}
	}
	if m := metaList(t, resp)[0]; m[MetaAlgorithm] != "" {
		t.Errorf("shadow limit in metadata: %v", m)
	}
}

func TestHitsAddend(t *testing.T) {
	f := newFixture(t, nil)
	r := req("test", desc("user=bob"))
	r.HitsAddend = 2
	check(t, "request hits 2", f.call(t, r), ok, want{ok, 1, time.Minute, perUser})
	// A descriptor's own hits_addend overrides the request's; 0 peeks.
	d := desc("user=bob")
	d.HitsAddend = wrapperspb.UInt64(0)
	r.Descriptors = []*ratelimitv3.RateLimitDescriptor{d}
	check(t, "peek", f.call(t, r), ok, want{ok, 1, time.Minute, perUser})
	// More than the capacity can never pass: over limit, nothing taken, no
	// retry time to promise: nothing remains for it, and the reset is the
	// limiter's (see answer_test.go).
	d.HitsAddend = wrapperspb.UInt64(math.MaxUint64)
	check(t, "huge cost", f.call(t, r), over, want{over, 0, time.Minute, perUser})
	d.HitsAddend = wrapperspb.UInt64(1)
	check(t, "one more", f.call(t, r), ok, want{ok, 0, time.Minute, perUser})
	d.HitsAddend = wrapperspb.UInt64(2)
	check(t, "over", f.call(t, r), over, want{over, 0, time.Minute, perUser})
}

func TestReplaces(t *testing.T) {
	f := newFixture(t, nil)
	narrow := rl("narrow", 100, rlsv3.RateLimitResponse_RateLimit_MINUTE, 1)
	broad := rl("broad", 1, rlsv3.RateLimitResponse_RateLimit_MINUTE, 1)
	for i := 0; i < 3; i++ {
		resp := f.call(t, req("test", desc("broad=x"), desc("narrow=y")))
		check(t, fmt.Sprint("replaced ", i), resp, ok, want{code: ok}, want{ok, uint32(99 - i), time.Minute, narrow})
	}
	// Alone, broad applies: it counted nothing while replaced.
	check(t, "alone", f.call(t, req("test", desc("broad=x"))), ok, want{ok, 0, time.Minute, broad})
	check(t, "alone over", f.call(t, req("test", desc("broad=x"))), over, want{over, 0, time.Minute, broad})
}

func TestLimitOverride(t *testing.T) {
	f := newFixture(t, nil)
	d := desc("user=carol")
	d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_SECOND}
	sec := rl("", 2, rlsv3.RateLimitResponse_RateLimit_SECOND, 1)
	check(t, "override 1", f.call(t, req("test", d)), ok, want{ok, 1, time.Second, sec})
	check(t, "override 2", f.call(t, req("test", d)), ok, want{ok, 0, time.Second, sec})
	check(t, "override 3", f.call(t, req("test", d)), over, want{over, 0, time.Second, sec})
	// The configured limit has its own counter.
	check(t, "configured", f.call(t, req("test", desc("user=carol"))), ok, want{ok, 2, time.Minute, perUser})
	// An override applies to descriptors the policy does not know, too.
	d2 := desc("unknown=x")
	d2.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_MINUTE, UnitMultiplier: wrapperspb.UInt32(90)}
	check(t, "multiplier", f.call(t, req("test", d2)), ok, want{ok, 4, 90 * time.Minute, rl("", 5, rlsv3.RateLimitResponse_RateLimit_MINUTE, 90)})
	// Zero requests: nothing passes.
	d3 := desc("user=zero")
	d3.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 0, Unit: typev3.RateLimitUnit_HOUR}
	check(t, "zero", f.call(t, req("test", d3)), over, want{over, 0, 0, rl("", 0, rlsv3.RateLimitResponse_RateLimit_HOUR, 1)})
	// Unknown domain: ignored.
	check(t, "unknown domain", f.call(t, req("nope", d)), ok, want{code: ok})
}

func TestMultiplierReporting(t *testing.T) {
	// 90 minutes is reported as 90 MINUTE; 1.5 hours the same.
	l := &policy.Limit{Window: 90 * time.Minute}
	if u, m := reportUnit(l); u != algorithms.UnitMinute || m != 90 {
		t.Errorf("90m: %v x%d", u, m)
	}
	l.Window = 1500 * time.Millisecond
	if u, m := reportUnit(l); u != algorithms.UnitUnknown || m != 0 {
		t.Errorf("1.5s: %v x%d", u, m)
	}
	l.Window, l.Unit = 7*24*time.Hour, algorithms.UnitWeek
	if u, m := reportUnit(l); u != algorithms.UnitWeek || m != 1 {
		t.Errorf("week: %v x%d", u, m)
	}
}

func TestInvalidRequests(t *testing.T) {
	f := newFixture(t, nil)
	many := make([]*ratelimitv3.RateLimitDescriptor, 10000)
	for i := range many {
		many[i] = desc(fmt.Sprintf("user=%d", i))
	}
	deep := desc()
	for i := 0; i < 65; i++ {
		deep.Entries = append(deep.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: "k", Value: "v"})
	}
	badUnit := desc("user=a")
	badUnit.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1}
	zeroMult := desc("user=a")
	zeroMult.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_SECOND, UnitMultiplier: wrapperspb.UInt32(0)}
	longMult := desc("user=a")
	longMult.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_YEAR, UnitMultiplier: wrapperspb.UInt32(math.MaxUint32)}
	cases := []struct {
		name string
		req  *rlsv3.RateLimitRequest
		msg  string
	}{
		{"nil request", nil, "domain: must not be empty"},
		{"empty domain", req("", desc("user=a")), "domain: must not be empty"},
		{"no descriptors", req("test"), "descriptors: must not be empty"},
		{"10k descriptors", req("test", many...), "descriptors: 10000 in one request, more than the 256 allowed"},
		{"null descriptor", req("test", desc("user=a"), nil), "descriptors[1]: must not be null"},
		{"65 entries", req("test", deep), "descriptors[0].entries: 65 entries, more than the 64 allowed"},
		{"unknown unit", req("test", desc("user=b"), badUnit), "descriptors[1].limit.unit: UNKNOWN is not a unit"},
		{"zero multiplier", req("test", zeroMult), "descriptors[0].limit.unit_multiplier: must be at least 1"},
		{"huge multiplier", req("test", longMult), "descriptors[0].limit.unit_multiplier: 4294967295 YEAR is too long"},
	}
	for _, c := range cases {
		resp, err := f.svc.ShouldRateLimit(context.Background(), c.req)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), c.msg) || resp != nil {
			t.Errorf("%s: got %v, %v; want InvalidArgument %q", c.name, resp, err, c.msg)
		}
	}
	// Nothing was counted by the refused requests.
	check(t, "after refusals", f.call(t, req("test", desc("user=a"))), ok, want{ok, 2, time.Minute, perUser})
	if got := value(t, f.svc.Metrics().Invalid.WithLabelValues(reasonTooMany)); got != 1 {
		t.Errorf("too-many counter %v", got)
	}
}

func TestHeaders(t *testing.T) {
	f := newFixture(t, nil)
	resp := f.call(t, req("test", desc("user=dave"), desc("api=v1/x"), desc("nobody=x")))
	wantHeaders(t, "first", resp,
		`RateLimit-Policy: "per_user";q=3;w=60, "api=v1*#0";q=1;w=1`,
		`RateLimit: "per_user";r=2;t=60, "api=v1*#0";r=1;t=1`)
	f.call(t, req("test", desc("user=dave")))
	f.call(t, req("test", desc("user=dave")))
	f.clock.Advance(20*time.Second + time.Millisecond)
	resp = f.call(t, req("test", desc("user=dave"), desc("gcra=g")))
	wantHeaders(t, "over", resp,
		`RateLimit-Policy: "per_user";q=3;w=60, "gcra#0";q=30;w=30`,
		`RateLimit: "per_user";r=0;t=40, "gcra#0";r=1;t=1`,
		`Retry-After: 40`)
	// A domain without response_headers gets none.
	if resp := f.call(t, req("quiet", desc("user=a"))); len(resp.ResponseHeadersToAdd) != 0 {
		t.Errorf("quiet domain got headers %v", resp.ResponseHeadersToAdd)
	}
}

func TestSFString(t *testing.T) {
	for in, want := range map[string]string{
		"plain":       `"plain"`,
		`q"uo\te`:     `"q\"uo\\te"`,
		"a\nb%c\x7fé": `"a%0Ab%25c%7F%C3%A9"`,
	} {
		var b strings.Builder
		appendSFString(&b, in)
		if b.String() != want {
			t.Errorf("%q: %s, want %s", in, b.String(), want)
		}
	}
	for ns, want := range map[int64]int64{-5: 0, 0: 0, 1: 1, int64(time.Second): 1, int64(time.Second) + 1: 2} {
		if got := ceilSeconds(ns); got != want {
			t.Errorf("ceilSeconds(%d) = %d, want %d", ns, got, want)
		}
	}
}

func wantHeaders(t *testing.T, step string, resp *rlsv3.RateLimitResponse, lines ...string) {
	t.Helper()
	var got []string
	for _, h := range resp.ResponseHeadersToAdd {
		got = append(got, h.Key+": "+h.Value)
	}
	if strings.Join(got, "\n") != strings.Join(lines, "\n") {
		t.Errorf("%s: headers\n%s\nwant\n%s", step, strings.Join(got, "\n"), strings.Join(lines, "\n"))
	}
}

func metaList(t *testing.T, resp *rlsv3.RateLimitResponse) []map[string]any {
	t.Helper()
	v, ok := resp.DynamicMetadata.GetFields()[MetadataKey]
	if !ok {
		t.Fatalf("no %q in dynamic metadata: %v", MetadataKey, resp.DynamicMetadata)
	}
	var out []map[string]any
	for _, e := range v.GetListValue().GetValues() {
		out = append(out, e.GetStructValue().AsMap())
	}
	if len(out) != len(resp.Statuses) {
		t.Fatalf("%d metadata entries for %d statuses", len(out), len(resp.Statuses))
	}
	return out
}

func TestMetadata(t *testing.T) {
	f := newFixture(t, nil)
	f.call(t, req("test", desc("user=erin")))
	f.call(t, req("test", desc("user=erin")))
	f.call(t, req("test", desc("user=erin")))
	f.clock.Advance(10 * time.Second)
	resp := f.call(t, req("test", desc("user=erin"), desc("api=v1/x"), desc("nobody=x"), desc("free=x"), desc("gcra=a"), desc("strict=s")))
	got := fmt.Sprint(metaList(t, resp))
	wantMeta := fmt.Sprint([]map[string]any{
		{"algorithm": "fixed_window", "limit": 3.0, "window_ms": 60000.0, "burst": 3.0, "retry_after_ms": 50000.0, "failure_mode": "open", "name": "per_user"},
		{"algorithm": "token_bucket", "limit": 1.0, "window_ms": 1000.0, "burst": 2.0, "retry_after_ms": 0.0, "failure_mode": "open", "name": "api=v1*#0"},
		{"algorithm": "", "limit": 0.0, "window_ms": 0.0, "burst": 0.0, "retry_after_ms": 0.0},
		{"algorithm": "", "limit": 0.0, "window_ms": 0.0, "burst": 0.0, "retry_after_ms": 0.0},
		{"algorithm": "gcra", "limit": 30.0, "window_ms": 30000.0, "burst": 2.0, "retry_after_ms": 0.0, "failure_mode": "open", "name": "gcra#0"},
		{"algorithm": "fixed_window", "limit": 5.0, "window_ms": 1000.0, "burst": 5.0, "retry_after_ms": 0.0, "failure_mode": "closed", "name": "strict#0"},
	})
	if got != wantMeta {
		t.Errorf("metadata\n got %s\nwant %s", got, wantMeta)
	}
}

// failingStore fails every call.
type failingStore struct{ calls atomic.Int64 }

func (f *failingStore) Name() string { return "failing" }
func (f *failingStore) Decide(ctx context.Context, checks []store.Check, out []algorithms.Result) error {
	f.calls.Add(1)
	return errors.New("redis: connection refused; memory: broken")
}

func TestFailureModes(t *testing.T) {
	st := &failingStore{}
	f := newFixture(t, st)
	strict := rl("", 5, rlsv3.RateLimitResponse_RateLimit_SECOND, 1)
	resp := f.call(t, req("test", desc("user=a"), desc("strict=b"), desc("free=c")))
	check(t, "store down", resp, over,
		want{ok, 0, 0, perUser}, want{over, 0, FailureRetryAfter, strict}, want{code: ok, remaining: math.MaxUint32})
	wantHeaders(t, "store down", resp, "Retry-After: 1")
	m := f.svc.Metrics()
	if a, b := value(t, m.FailureMode.WithLabelValues("test", "open")), value(t, m.FailureMode.WithLabelValues("test", "closed")); a != 1 || b != 1 {
		t.Errorf("failure mode counters open %v closed %v, want 1 and 1", a, b)
	}
	if got := value(t, m.StoreErrors.WithLabelValues("test")); got != 1 {
		t.Errorf("store errors %v, want 1", got)
	}
	meta := metaList(t, resp)
	if meta[0][MetaAlgorithm] != "" || meta[1][MetaAlgorithm] != "" || meta[1][MetaRetryAfter] != 1000.0 {
		t.Errorf("metadata for failure-mode decisions: %v", meta)
	}
	// No store call at all when nothing is limited.
	n := st.calls.Load()
	f.call(t, req("test", desc("free=x"), desc("nobody=y")))
	if st.calls.Load() != n {
		t.Error("the store was called for a request without limits")
	}
	// The caller giving up is an error, not a failure mode.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := f.svc.ShouldRateLimit(ctx, req("test", desc("user=a"))); status.Code(err) != codes.Canceled {
		t.Errorf("canceled: %v", err)
	}
}

// TestHostileValues: values that trip naive key schemes each get their own
// counter, and nothing panics.
func TestHostileValues(t *testing.T) {
	f := newFixture(t, nil)
	values := []string{"", "a", "a:b", "a_b", "a\x00", "a\n", "{a}", "}{", "a\x00b", strings.Repeat("x", 64<<10), strings.Repeat("x", 64<<10) + "y", "é", "\xff\xfe"}
	for _, v := range values {
		resp := f.call(t, req("test", &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: v}}}))
		if resp.Statuses[0].LimitRemaining != 2 {
			t.Errorf("value %.20q shares a counter: remaining %d", v, resp.Statuses[0].LimitRemaining)
		}
	}
	// Nested: entries whose concatenations coincide.
	pairs := [][2]string{{"a_team", "b"}, {"a", "team_b"}, {"a:", "b"}, {"a", ":b"}}
	for _, p := range pairs {
		resp := f.call(t, req("test", desc("org="+p[0], "team="+p[1])))
		if resp.Statuses[0].LimitRemaining != 1 {
			t.Errorf("org %q team %q shares a counter: remaining %d", p[0], p[1], resp.Statuses[0].LimitRemaining)
		}
	}
}

// TestRandomRequests throws random requests at the service: each is
// answered or refused with InvalidArgument, never a panic.
func TestRandomRequests(t *testing.T) {
	f := newFixture(t, nil)
	rng := rand.New(rand.NewPCG(7, 7))
	pick := func(xs ...string) string { return xs[rng.IntN(len(xs))] }
	for i := 0; i < 3000; i++ {
		r := &rlsv3.RateLimitRequest{Domain: pick("test", "quiet", "", "x"), HitsAddend: uint32(rng.IntN(4))}
		for j := rng.IntN(5); j > 0; j-- {
			d := &ratelimitv3.RateLimitDescriptor{}
			for k := rng.IntN(4); k > 0; k-- {
				d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{
					Key:   pick("user", "api", "org", "team", "free", "shadow", "strict", "gcra", "broad", "narrow", ""),
					Value: pick("", "v1/a", "x", "v1*", "\x00", "{}"),
				})
			}
			if rng.IntN(5) == 0 {
				d.HitsAddend = wrapperspb.UInt64(rng.Uint64N(8))
			}
			if rng.IntN(8) == 0 {
				d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: uint32(rng.IntN(3)), Unit: typev3.RateLimitUnit(rng.IntN(8))}
			}
			if rng.IntN(40) == 0 {
				d = nil
			}
			r.Descriptors = append(r.Descriptors, d)
		}
		f.clock.Advance(time.Duration(rng.IntN(int(time.Second))))
		resp, err := f.svc.ShouldRateLimit(context.Background(), r)
		switch {
		case err != nil && status.Code(err) != codes.InvalidArgument:
			t.Fatalf("request %v: %v", r, err)
		case err == nil && len(resp.Statuses) != len(r.Descriptors):
			t.Fatalf("request %v: %d statuses", r, len(resp.Statuses))
		}
	}
}

// TestPolicySwap swaps policies while requests run: every response comes
// from one whole version (both descriptors name the same version's limits).
func TestPolicySwap(t *testing.T) {
	versions := []*policy.Set{}
	for v := 1; v <= 2; v++ {
		versions = append(versions, parse(t, fmt.Sprintf(`
domain: swap
descriptors:
  - key: a
    rate_limit: {name: a%[1]d, unit: hour, requests_per_unit: %[1]d000}
  - key: b
    rate_limit: {name: b%[1]d, unit: hour, requests_per_unit: %[1]d000}
`, v)))
	}
	f := newFixture(t, nil)
	f.svc.SetPolicies(versions[0])
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var seen [3]atomic.Int64
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := f.svc.ShouldRateLimit(context.Background(), req("swap", desc("a=x"), desc("b=y")))
				if err != nil {
					t.Error(err)
					return
				}
				a, b := resp.Statuses[0].CurrentLimit, resp.Statuses[1].CurrentLimit
				if a.Name[1:] != b.Name[1:] || fmt.Sprint(a.RequestsPerUnit/1000) != a.Name[1:] {
					t.Errorf("torn response: %v / %v", fmtLimit(a), fmtLimit(b))
					return
				}
				seen[a.RequestsPerUnit/1000].Add(1)
			}
		}()
	}
	for i := 0; i < 200; i++ {
		f.svc.SetPolicies(versions[i%2])
		target := seen[1].Load() + seen[2].Load() + 5
		for seen[1].Load()+seen[2].Load() < target && !t.Failed() {
			time.Sleep(50 * time.Microsecond)
		}
	}
	close(stop)
	wg.Wait()
	if seen[1].Load() == 0 || seen[2].Load() == 0 {
		t.Errorf("versions seen: %d and %d", seen[1].Load(), seen[2].Load())
	}
	f.svc.SetPolicies(nil)
	check(t, "no policies", f.call(t, req("swap", desc("a=x"))), ok, want{code: ok})
}

func TestNewValidates(t *testing.T) {
	if _, err := New(nil, nil, Options{}); err == nil {
		t.Error("nil store accepted")
	}
	if _, err := New(memory.New(memory.Options{}), nil, Options{MaxDescriptors: -1}); err == nil {
		t.Error("negative MaxDescriptors accepted")
	}
	s, err := New(memory.New(memory.Options{}), nil, Options{MaxDescriptors: 2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.ShouldRateLimit(context.Background(), req("d", desc(), desc(), desc())); status.Code(err) != codes.InvalidArgument {
		t.Errorf("3 descriptors with a cap of 2: %v", err)
	}
}

func TestMetricsRegistered(t *testing.T) {
	f := newFixture(t, nil)
	f.call(t, req("test", desc("user=a")))
	f.call(t, req("evil-domain-name", desc("user=a")))
	mfs, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				// Configured domains (every rule's statistics exist from the
				// start) and "unknown"; never the request's domain.
				if l.GetName() == "domain" && f.svc.Policies().Domain(l.GetValue()) == nil && l.GetValue() != unknownDomain {
					t.Errorf("domain label %q", l.GetValue())
				}
			}
		}
	}
	for _, n := range []string{"sluice_rls_decisions_total", "sluice_rls_request_duration_seconds", "sluice_rls_invalid_requests_total"} {
		if !contains(names, n) {
			t.Errorf("metric %s not registered (have %v)", n, names)
		}
	}
	if got := value(t, f.svc.Metrics().Decisions.WithLabelValues(unknownDomain, "OK")); got != 1 {
		t.Errorf("unknown-domain decisions %v", got)
	}
}

// value returns the value of a single-metric counter or gauge.
func value(t *testing.T, c prometheus.Collector) float64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 1)
	c.Collect(ch)
	var m dto.Metric
	if err := (<-ch).Write(&m); err != nil {
		t.Fatal(err)
	}
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	}
	t.Fatal("not a counter or gauge")
	return 0
}

// benchFixture returns a service whose one policy never refuses, and 1,024
// requests on distinct keys.
func benchFixture(b *testing.B) (*fixture, []*rlsv3.RateLimitRequest) {
	f := newFixture(b, nil)
	f.svc.SetPolicies(parse(b, `
domain: bench
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1000000000}
`))
	reqs := make([]*rlsv3.RateLimitRequest, 1024)
	for i := range reqs {
		reqs[i] = req("bench", desc(fmt.Sprintf("k=%d", i)))
	}
	return f, reqs
}

func BenchmarkShouldRateLimit(b *testing.B) {
	f, reqs := benchFixture(b)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if _, err := f.svc.ShouldRateLimit(context.Background(), reqs[i%len(reqs)]); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}

// TestBlockingPolicy: envoyproxy/ratelimit's requests_per_unit: 0 refuses
// every request without asking the store.
func TestBlockingPolicy(t *testing.T) {
	st := &failingStore{}
	svc, err := New(st, parse(t, `
domain: blocked
descriptors:
  - key: ip
    value: 10.0.0.1
    rate_limit: {unit: second, requests_per_unit: 0}
`), Options{Logger: quiet, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		resp, err := svc.ShouldRateLimit(context.Background(), req("blocked", desc("ip=10.0.0.1")))
		if err != nil {
			t.Fatal(err)
		}
		if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 0 {
			t.Fatalf("call %d: %v, want OVER_LIMIT with a limit of 0", i, resp)
		}
	}
	if st.calls.Load() != 0 {
		t.Fatalf("the store was asked %d times for a limit of 0", st.calls.Load())
	}
	if m := metaList(t, mustCall(t, svc, req("blocked", desc("ip=10.0.0.1")))); m[0]["algorithm"] != "" {
		t.Fatalf("metadata %v: a limit of 0 must not size the filter's bucket", m)
	}
}

func mustCall(t *testing.T, svc *Service, r *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := svc.ShouldRateLimit(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// BenchmarkShouldRateLimitWire is BenchmarkShouldRateLimit on wire bytes,
// as the unary server calls it: decoding and encoding included.
func BenchmarkShouldRateLimitWire(b *testing.B) {
	f, msgs := benchFixture(b)
	reqs := make([][]byte, len(msgs))
	for i := range reqs {
		var err error
		if reqs[i], err = proto.Marshal(msgs[i]); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if _, err := f.svc.ShouldRateLimitWire(context.Background(), nil, reqs[i%len(reqs)]); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}
