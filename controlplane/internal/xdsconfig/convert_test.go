package xdsconfig

import (
	"strings"
	"testing"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluicehq/sluice/controlplane/policy"
	"github.com/sluicehq/sluice/internal/xdstest"
)

func anyOf(t *testing.T, cfgs ...*rlsconfv3.RateLimitConfig) []*anypb.Any {
	t.Helper()
	out := make([]*anypb.Any, len(cfgs))
	for i, c := range cfgs {
		a, err := anypb.New(c)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = a
	}
	return out
}

// TestDecodeEnvoyGatewayShapes converts resources shaped as Envoy Gateway
// writes them and checks what each request descriptor matches.
func TestDecodeEnvoyGatewayShapes(t *testing.T) {
	route := "httproute/default/backend/rule/0/match/0/www_example_com"
	hour := rlsconfv3.RateLimitUnit_HOUR
	listener := xdstest.Config("default/eg/http", xdstest.RouteDescriptor(route,
		xdstest.Rule{Headers: []bool{false}, Requests: 3, Unit: hour},
		xdstest.Rule{Headers: []bool{true}, Requests: 2, Unit: hour},
		xdstest.Rule{CIDR: "127.0.0.0/8", CIDRDistinct: true, Requests: 5, Unit: rlsconfv3.RateLimitUnit_MINUTE},
		xdstest.Rule{Method: true, Path: true, Requests: 4, Unit: hour},
		xdstest.Rule{Requests: 21, Unit: hour, Shadow: true},
	))
	shared := xdstest.Config("default/shared", xdstest.RouteDescriptor("default/shared/rule/0", xdstest.Rule{Requests: 7, Unit: hour}))
	set, err := Decode(anyOf(t, listener, shared))
	if err != nil {
		t.Fatal(err)
	}
	if set.Len() != 2 {
		t.Fatalf("domains: %d, want 2", set.Len())
	}
	d := set.Domain("default/eg/http")
	e := func(kv ...string) []policy.Entry {
		out := []policy.Entry{{Key: route, Value: route}}
		for i := 0; i < len(kv); i += 2 {
			out = append(out, policy.Entry{Key: kv[i], Value: kv[i+1]})
		}
		return out
	}
	for _, tc := range []struct {
		name    string
		entries []policy.Entry
		want    int64 // requests of the matched limit; 0: none
		shadow  bool
	}{
		{"header match", e("rule-0-match-0", "rule-0-match-0"), 3, false},
		{"distinct", e("rule-1-match-0", "alice"), 2, false},
		{"cidr", e("masked_remote_address", "127.0.0.0/8", "remote_address", "127.0.0.1"), 5, false},
		{"cidr other network", e("masked_remote_address", "10.0.0.0/8", "remote_address", "10.0.0.1"), 0, false},
		{"method and path", e("rule-3-method", "rule-3-method", "rule-3-path", "rule-3-path"), 4, false},
		{"route-wide shadow", e("rule-4-match--1", "rule-4-match--1"), 21, true},
		{"other route", []policy.Entry{{Key: "x", Value: "x"}, {Key: "rule-0-match-0", Value: "rule-0-match-0"}}, 0, false},
	} {
		got := d.Match(tc.entries)
		switch {
		case tc.want == 0 && len(got) != 0:
			t.Errorf("%s: matched %v, want nothing", tc.name, got[0].ID)
		case tc.want != 0 && (len(got) != 1 || got[0].Requests != tc.want || got[0].ShadowMode != tc.shadow):
			t.Errorf("%s: matched %v, want one limit of %d (shadow %v)", tc.name, got, tc.want, tc.shadow)
		}
	}
	if l := set.Domain("default/shared").Match([]policy.Entry{{Key: "default/shared/rule/0", Value: "default/shared/rule/0"}, {Key: "rule-0-match--1", Value: "rule-0-match--1"}}); len(l) != 1 || l[0].Requests != 7 {
		t.Errorf("shared rule: matched %v", l)
	}
	if src := d.Source; src != "xds:default/eg/http" {
		t.Errorf("source %q", src)
	}
}

// TestDecodeRefusesNamingResourceAndField: an invalid resource makes the
// whole response invalid, and the error names the resource and the field.
func TestDecodeRefusesNamingResourceAndField(t *testing.T) {
	good := xdstest.Config("ok", xdstest.RouteDescriptor("r", xdstest.Rule{Requests: 1, Unit: rlsconfv3.RateLimitUnit_SECOND}))
	noUnit := xdstest.Config("bad-unit", xdstest.RouteDescriptor("r", xdstest.Rule{Requests: 1}))
	noDomain := &rlsconfv3.RateLimitConfig{Name: "nameless"}
	for _, tc := range []struct {
		name string
		res  []*anypb.Any
		want []string
	}{
		{"unknown unit", anyOf(t, good, noUnit), []string{`resource "bad-unit"`, "descriptors[0].descriptors[0].rate_limit.unit"}},
		{"no domain", anyOf(t, noDomain), []string{`resource "nameless"`, "domain"}},
		{"one domain twice", anyOf(t, good, good), []string{`"ok"`, "duplicate domain"}},
		{"other type", []*anypb.Any{{TypeUrl: "type.googleapis.com/other", Value: nil}}, []string{`resource "#0"`, "type"}},
	} {
		set, err := Decode(tc.res)
		if err == nil {
			t.Errorf("%s: accepted (%d domains)", tc.name, set.Len())
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not name %q", tc.name, err, w)
			}
		}
	}
	if _, err := Decode(make([]*anypb.Any, policy.MaxDomains+1)); err == nil {
		t.Error("more than policy.MaxDomains resources accepted")
	}
}

// TestConvertKeepsFields: unlimited, name and replaces, detailed_metric
// and the units all reach the policy.
func TestConvertKeepsFields(t *testing.T) {
	rc := &rlsconfv3.RateLimitConfig{Name: "n", Domain: "d", Descriptors: []*rlsconfv3.RateLimitDescriptor{
		{Key: "a", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_WEEK, RequestsPerUnit: 9, Name: "wide"}, DetailedMetric: true},
		{Key: "a", Value: "vip", RateLimit: &rlsconfv3.RateLimitPolicy{Unlimited: true, Replaces: []*rlsconfv3.RateLimitReplace{{Name: "wide"}}}},
	}}
	d, err := Convert(rc)
	if err != nil {
		t.Fatal(err)
	}
	if got := d.Match([]policy.Entry{{Key: "a", Value: "x"}}); len(got) != 1 || got[0].Window.Hours() != 7*24 || got[0].Requests != 9 || !got[0].DetailedMetric {
		t.Errorf("a=x: %+v", got)
	}
	got := d.DropReplaced([][]*policy.Limit{d.Match([]policy.Entry{{Key: "a", Value: "vip"}})})
	if len(got) != 1 || len(got[0]) != 1 || !got[0][0].Unlimited {
		t.Errorf("a=vip: %+v", got)
	}
}

// TestConvertMetadata: a descriptor's metadata reaches the policy as it
// was sent, whatever its types (a string of digits stays a string).
func TestConvertMetadata(t *testing.T) {
	md, err := structpb.NewStruct(map[string]any{"s": "123", "t": "true", "n": 5, "f": 1.5, "e": 1e21, "b": true, "z": nil,
		"l": []any{1, "x", []any{}}, "m": map[string]any{"k": "v", "nested": map[string]any{}}})
	if err != nil {
		t.Fatal(err)
	}
	d, err := Convert(&rlsconfv3.RateLimitConfig{Domain: "md", Descriptors: []*rlsconfv3.RateLimitDescriptor{{Key: "k", Metadata: md,
		RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: 1}}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := d.Limits()[0].Metadata; !proto.Equal(got, md) {
		t.Errorf("metadata %v, want %v", got, md)
	}
}
