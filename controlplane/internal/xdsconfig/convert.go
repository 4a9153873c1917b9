package xdsconfig

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluicehq/sluice/controlplane/policy"
)

// TypeURL is the xDS resource type sluice subscribes to: envoyproxy/ratelimit's
// configuration, as Envoy Gateway serves it.
const TypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// sourcePrefix starts the Source of every domain read over xDS, so that
// errors and /rlconfig say where a domain came from.
const sourcePrefix = "xds:"

// ResourceError is one invalid resource of a response: its name and what
// sluice's validator said about it, field by field.
type ResourceError struct {
	// Resource is the resource's name (RateLimitConfig.name), or its index
	// when it has none.
	Resource string
	// Err is the problem: a policy.ErrorList when the policy is invalid.
	Err error
}

// Error names the resource and each field at fault, e.g.
// `resource "default/eg/http": descriptors[0].rate_limit.unit: ...`.
func (e *ResourceError) Error() string {
	var list policy.ErrorList
	if !errors.As(e.Err, &list) {
		return fmt.Sprintf("resource %q: %v", e.Resource, e.Err)
	}
	parts := make([]string, len(list))
	for i, pe := range list {
		field := pe.Field
		if field == "" {
			field = "(resource)"
		}
		parts[i] = fmt.Sprintf("resource %q: %s: %s", e.Resource, field, pe.Problem)
	}
	return strings.Join(parts, "\n")
}

func (e *ResourceError) Unwrap() error { return e.Err }

// Decode converts the resources of one xDS response into a policy set,
// validating each with sluice's policy parser as a policy file would be. Any
// invalid resource, a resource of another type, two resources naming one
// domain, or a response past the bounds of a policy set (policy.MaxDomains
// resources, MaxSetSize bytes, MaxDescriptors, MaxLimits; MaxDocumentSize
// bytes a resource) make the whole response invalid: the error names every
// resource at fault, or the bound. The bounds are checked on the wire bytes,
// before any resource is decoded (see checkBounds).
func Decode(resources []*anypb.Any) (*policy.Set, error) {
	if len(resources) > policy.MaxDomains {
		return nil, fmt.Errorf("%d resources: a policy set holds at most %d domains, one a resource: %s",
			len(resources), policy.MaxDomains, boundHint)
	}
	wire := make([]wireResource, len(resources))
	for i, res := range resources {
		w := &wire[i]
		w.name = "#" + strconv.Itoa(i)
		if res.GetTypeUrl() != TypeURL {
			w.err = fmt.Errorf("type %q: want %s", res.GetTypeUrl(), TypeURL)
			continue
		}
		w.value = res.GetValue()
		w.counts, w.err = scanConfig(w.value)
		if w.counts.name != "" {
			w.name = w.counts.name
		}
		if w.err != nil && w.err != errTooDeep {
			w.err = fmt.Errorf("cannot decode: %v", w.err)
		}
	}
	if err := checkBounds(wire); err != nil {
		return nil, err
	}
	var errs []error
	domains := make([]*policy.Domain, 0, len(resources))
	for i, res := range resources {
		w := &wire[i]
		if w.err != nil {
			errs = append(errs, &ResourceError{Resource: w.name, Err: w.err})
			continue
		}
		var rc rlsconfv3.RateLimitConfig
		if err := res.UnmarshalTo(&rc); err != nil {
			errs = append(errs, &ResourceError{Resource: w.name, Err: fmt.Errorf("cannot decode: %v", err)})
			continue
		}
		d, err := Convert(&rc)
		if err != nil {
			errs = append(errs, &ResourceError{Resource: w.name, Err: err})
			continue
		}
		domains = append(domains, d)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	set, err := policy.NewSet(domains...)
	if err != nil {
		return nil, err
	}
	return set, nil
}

// Convert turns one RateLimitConfig into a validated policy domain. The
// resource is written as the envoyproxy/ratelimit YAML it stands for
// (domain, descriptors with key, value, rate_limit {unit,
// requests_per_unit, unlimited, name, replaces}, shadow_mode,
// detailed_metric, quota_mode, metadata), as nodes, and parsed by
// policy.ParseNode, so a resource is accepted exactly when the same policy
// would be (Decode bounds its size on the wire, where a file's is bounded
// as text), and the error's fields are the resource's
// (descriptors[0].rate_limit.unit). The resource's name is only used in
// messages: the domain is its domain field, as envoyproxy/ratelimit reads
// it.
func Convert(rc *rlsconfv3.RateLimitConfig) (*policy.Domain, error) {
	root := mapNode()
	addStr(root, "domain", rc.GetDomain())
	if ds := rc.GetDescriptors(); len(ds) > 0 {
		addNode(root, "descriptors", descriptorsNode(ds))
	}
	name := rc.GetName()
	if name == "" {
		name = rc.GetDomain()
	}
	return policy.ParseNode(sourcePrefix+name, root)
}

// descriptorsNode writes a descriptor list.
func descriptorsNode(ds []*rlsconfv3.RateLimitDescriptor) *yaml.Node {
	seq := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
	for _, d := range ds {
		m := mapNode()
		addStr(m, "key", d.GetKey())
		if d.GetValue() != "" {
			addStr(m, "value", d.GetValue())
		}
		if rl := d.GetRateLimit(); rl != nil {
			addNode(m, "rate_limit", limitNode(rl))
		}
		if d.GetShadowMode() {
			addBool(m, "shadow_mode", true)
		}
		if d.GetDetailedMetric() {
			addBool(m, "detailed_metric", true)
		}
		if d.GetQuotaMode() {
			addBool(m, "quota_mode", true)
		}
		if md := d.GetMetadata(); md != nil {
			addNode(m, "metadata", structNode(md))
		}
		if sub := d.GetDescriptors(); len(sub) > 0 {
			addNode(m, "descriptors", descriptorsNode(sub))
		}
		seq.Content = append(seq.Content, m)
	}
	return seq
}

// limitNode writes a rate_limit. An UNKNOWN unit is written as "unknown",
// which the parser refuses, naming the field.
func limitNode(rl *rlsconfv3.RateLimitPolicy) *yaml.Node {
	m := mapNode()
	if rl.GetUnlimited() {
		addBool(m, "unlimited", true)
	} else {
		addStr(m, "unit", strings.ToLower(rl.GetUnit().String()))
		addStr(m, "requests_per_unit", strconv.FormatUint(uint64(rl.GetRequestsPerUnit()), 10))
		m.Content[len(m.Content)-1].Tag = "!!int"
	}
	if rl.GetName() != "" {
		addStr(m, "name", rl.GetName())
	}
	if rs := rl.GetReplaces(); len(rs) > 0 {
		seq := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		for _, r := range rs {
			rm := mapNode()
			addStr(rm, "name", r.GetName())
			seq.Content = append(seq.Content, rm)
		}
		addNode(m, "replaces", seq)
	}
	return m
}

// structNode writes a metadata Struct as YAML, directly: through AsMap and
// yaml.Node.Encode (which writes YAML text and parses it back) a 1 MiB
// Struct cost 190 MiB and most of a second.
func structNode(s *structpb.Struct) *yaml.Node {
	m := mapNode()
	for _, k := range slices.Sorted(maps.Keys(s.GetFields())) {
		addNode(m, k, valueNode(s.GetFields()[k]))
	}
	return m
}

// valueNode writes one metadata value, as yaml.Marshal would write what
// AsMap makes of it.
func valueNode(v *structpb.Value) *yaml.Node {
	scalar := func(tag, s string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: tag, Value: s} }
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		return scalar("!!str", k.StringValue)
	case *structpb.Value_BoolValue:
		return scalar("!!bool", strconv.FormatBool(k.BoolValue))
	case *structpb.Value_NumberValue:
		switch f := k.NumberValue; {
		case math.IsNaN(f):
			return scalar("!!float", ".nan")
		case math.IsInf(f, 1):
			return scalar("!!float", ".inf")
		case math.IsInf(f, -1):
			return scalar("!!float", "-.inf")
		default:
			return scalar("", strconv.FormatFloat(f, 'g', -1, 64))
		}
	case *structpb.Value_StructValue:
		return structNode(k.StructValue)
	case *structpb.Value_ListValue:
		seq := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		for _, e := range k.ListValue.GetValues() {
			seq.Content = append(seq.Content, valueNode(e))
		}
		return seq
	}
	return scalar("!!null", "null")
}

func mapNode() *yaml.Node { return &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"} }

func addNode(m *yaml.Node, key string, v *yaml.Node) {
	m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: key}, v)
}

func addStr(m *yaml.Node, key, s string) {
	addNode(m, key, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s})
}

func addBool(m *yaml.Node, key string, b bool) {
	addNode(m, key, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: strconv.FormatBool(b)})
}
