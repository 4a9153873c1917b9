package rls

import (
	"context"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/controlplane/store/memory"
)

// newestKeysPolicy uses envoyproxy/ratelimit's newest keys: quota_mode,
// metadata and a "*" inside a value.
const newestKeysPolicy = `
domain: quota
descriptors:
  - key: plan
    value: team-*-prod
    quota_mode: true
    metadata: {tier: premium, route: {region: eu, pool: a}}
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: plan
    value: free
    quota_mode: true
    metadata: {tier: free, route: {pool: b, zone: 1}, extra: x}
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: user
    metadata: {tier: user}
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: free
    metadata: {never: returned}
    rate_limit: {unlimited: true}
`

func newestKeysService(t *testing.T, opts Options) *Service {
	t.Helper()
	c := &clock{}
	c.ns.Store(epoch.UnixNano())
	opts.Logger, opts.Registerer = quiet, prometheus.NewRegistry()
	svc, err := New(memory.New(memory.Options{Now: c.Now}), parse(t, newestKeysPolicy), opts)
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

func (s *Service) mustCall(t *testing.T, r *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := s.ShouldRateLimit(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestQuotaMode follows envoyproxy/ratelimit's quota_mode: a quota-mode
// descriptor over its limit answers OVER_LIMIT in its own status, but the
// request is over only when every quota-mode descriptor is (or a descriptor
// not in quota mode is). QuotaMode (QUOTA_MODE) puts every descriptor in
// quota mode, those without a limit too (they never fail).
func TestQuotaMode(t *testing.T) {
	svc := newestKeysService(t, Options{})
	both := req("quota", desc("plan=team-a-prod"), desc("plan=free"))
	check(t, "both quotas fresh", svc.mustCall(t, both), ok)
	resp := svc.mustCall(t, req("quota", desc("plan=team-a-prod"), desc("plan=team-b-prod")))
	// team-a is now over; team-b takes its own counter and passes.
	if resp.OverallCode != ok || resp.Statuses[0].Code != over || resp.Statuses[1].Code != ok {
		t.Fatalf("one quota over: overall %v, statuses %v %v", resp.OverallCode, resp.Statuses[0].Code, resp.Statuses[1].Code)
	}
	check(t, "every quota over", svc.mustCall(t, both), over)
	svc.mustCall(t, req("quota", desc("plan=team-c-prod"), desc("user=u"))) // spends user=u
	check(t, "a rate limit over with quota passing", svc.mustCall(t, req("quota", desc("plan=team-d-prod"), desc("user=u"))), over)

	global := newestKeysService(t, Options{QuotaMode: true})
	global.mustCall(t, req("quota", desc("user=u")))
	check(t, "QUOTA_MODE: the only descriptor over", global.mustCall(t, req("quota", desc("user=u"))), over)
	check(t, "QUOTA_MODE: another descriptor passes", global.mustCall(t, req("quota", desc("user=u"), desc("user=v"))), ok)
	check(t, "QUOTA_MODE: a descriptor without a limit counts as passing", global.mustCall(t, req("quota", desc("user=u"), desc("nothing=here"))), ok)
}

// TestResponseMetadata follows envoyproxy/ratelimit's
// RESPONSE_DYNAMIC_METADATA: the answer carries the domain, the request's
// descriptors and hits_addend, and the metadata of the descriptors that
// passed, merged (first value wins, mappings merge); sluice's own field
// stays. Off, none of it is added. Both encoders of the answer carry it.
func TestResponseMetadata(t *testing.T) {
	off := newestKeysService(t, Options{})
	if md := off.mustCall(t, req("quota", desc("plan=team-a-prod"))).DynamicMetadata; md.GetFields()[ERMetaDomain] != nil {
		t.Fatalf("metadata without the option: %v", md)
	}

	svc := newestKeysService(t, Options{ResponseMetadata: true})
	svc.mustCall(t, req("quota", desc("user=spent")))
	hits := desc("plan=free")
	hits.HitsAddend = wrapperspb.UInt64(0)
	one := desc("plan=team-a-prod")
	one.HitsAddend = wrapperspb.UInt64(1)
	r := req("quota", one, hits, desc("user=spent"), desc("free=x"))
	r.HitsAddend = 3
	resp := svc.mustCall(t, r)
	want, err := structpb.NewStruct(map[string]any{
		"domain": "quota",
		"descriptors": []any{
			map[string]any{"entries": []any{"plan=team-a-prod"}, "hitsAddend": 1},
			map[string]any{"entries": []any{"plan=free"}, "hitsAddend": 0},
			map[string]any{"entries": []any{"user=spent"}},
			map[string]any{"entries": []any{"free=x"}},
		},
		"hitsAddend": 3,
		// team-a-prod's first, then free's keys it lacks; user=spent is
		// over limit and free=x unlimited: theirs are left out.
		"metadata": map[string]any{"tier": "premium", "route": map[string]any{"region": "eu", "pool": "a", "zone": 1}, "extra": "x"},
	})
	if err != nil {
		t.Fatal(err)
	}
	got := resp.DynamicMetadata
	if got.GetFields()[MetadataKey] == nil {
		t.Fatal("sluice's own metadata is gone")
	}
	for k, v := range want.GetFields() {
		if !proto.Equal(got.GetFields()[k], v) {
			t.Errorf("%s:\n got %v\nwant %v", k, got.GetFields()[k], v)
		}
	}
	if len(got.GetFields()) != len(want.GetFields())+1 {
		t.Errorf("fields: %v", got)
	}
	// The configured metadata is not changed by the merge.
	again := svc.mustCall(t, req("quota", desc("plan=free")))
	if m := again.DynamicMetadata.GetFields()[ERMetaMetadata].GetStructValue().AsMap(); len(m["route"].(map[string]any)) != 2 {
		t.Fatalf("a merge changed the policy's metadata: %v", m)
	}
	// grpc-go's codec and the unary server's encoder both carry it.
	if back := decodeResponse(t, svc, resp); !proto.Equal(back, resp) {
		t.Fatalf("codec lost it:\n got %v\nwant %v", back, resp)
	}
	wire, err := proto.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	fresh := newestKeysService(t, Options{ResponseMetadata: true})
	fresh.mustCall(t, req("quota", desc("user=spent")))
	out, err := fresh.ShouldRateLimitWire(context.Background(), nil, wire)
	if err != nil {
		t.Fatal(err)
	}
	var fromWire rlsv3.RateLimitResponse
	if err := proto.Unmarshal(out, &fromWire); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(fromWire.DynamicMetadata, resp.DynamicMetadata) {
		t.Fatalf("unary encoder:\n got %v\nwant %v", fromWire.DynamicMetadata, resp.DynamicMetadata)
	}
	// A limit override is reported in protobuf text.
	ovr := desc("user=o")
	ovr.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: 2}
	d := svc.mustCall(t, req("quota", ovr)).DynamicMetadata.GetFields()[ERMetaDescriptors].GetListValue().GetValues()[0].GetStructValue()
	if s := d.GetFields()[ERMetaLimit].GetStringValue(); s == "" {
		t.Fatalf("override not reported: %v", d)
	}
}
