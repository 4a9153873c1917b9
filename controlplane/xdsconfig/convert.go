package xdsconfig

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/sluicehq/sluice/controlplane/policy"
)

// TypeURL is the xDS resource type sluice subscribes to: envoyproxy/ratelimit's
// configuration, as Envoy Gateway serves it.
const TypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// MaxResources bounds the resources one response may carry; a response with
// more is NACKed whole.
const MaxResources = 10000

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
// domain, or more than MaxResources make the whole response invalid: the
// error names every resource at fault.
func Decode(resources []*anypb.Any) (*policy.Set, error) {
	if len(resources) > MaxResources {
		return nil, fmt.Errorf("%d resources: at most %d are accepted in one response", len(resources), MaxResources)
	}
	var errs []error
	domains := make([]*policy.Domain, 0, len(resources))
	for i, res := range resources {
		name := "#" + strconv.Itoa(i)
		if res.GetTypeUrl() != TypeURL {
			errs = append(errs, &ResourceError{Resource: name, Err: fmt.Errorf("type %q: want %s", res.GetTypeUrl(), TypeURL)})
			continue
		}
		var rc rlsconfv3.RateLimitConfig
		if err := res.UnmarshalTo(&rc); err != nil {
			errs = append(errs, &ResourceError{Resource: name, Err: fmt.Errorf("cannot decode: %v", err)})
			continue
		}
		if rc.GetName() != "" {
			name = rc.GetName()
		}
		d, err := Convert(&rc)
		if err != nil {
			errs = append(errs, &ResourceError{Resource: name, Err: err})
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
// detailed_metric, quota_mode, metadata) and parsed by policy.Parse, so a
// resource is accepted exactly when the same policy file would be, and the
// error's fields are the resource's (descriptors[0].rate_limit.unit).
// The resource's name is only used in messages: the domain is its domain
// field, as envoyproxy/ratelimit reads it.
func Convert(rc *rlsconfv3.RateLimitConfig) (*policy.Domain, error) {
	root := mapNode()
	addStr(root, "domain", rc.GetDomain())
	if ds := rc.GetDescriptors(); len(ds) > 0 {
		n, err := descriptorsNode(ds)
		if err != nil {
			return nil, err
		}
		addNode(root, "descriptors", n)
	}
	data, err := yaml.Marshal(root)
	if err != nil {
		return nil, fmt.Errorf("cannot write the policy: %v", err)
	}
	name := rc.GetName()
	if name == "" {
		name = rc.GetDomain()
	}
	d, err := policy.Parse(sourcePrefix+name, data)
	if err != nil {
		return nil, withoutLines(err)
	}
	return d, nil
}

// withoutLines drops line numbers from the parser's errors: they count lines
// of YAML the user never saw.
func withoutLines(err error) error {
	var list policy.ErrorList
	if !errors.As(err, &list) {
		return err
	}
	out := make(policy.ErrorList, len(list))
	for i, e := range list {
		c := *e
		c.Line = 0
		out[i] = &c
	}
	return out
}

// descriptorsNode writes a descriptor list.
func descriptorsNode(ds []*rlsconfv3.RateLimitDescriptor) (*yaml.Node, error) {
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
			n := &yaml.Node{}
			if err := n.Encode(md.AsMap()); err != nil {
				return nil, fmt.Errorf("metadata: %v", err)
			}
			addNode(m, "metadata", n)
		}
		if sub := d.GetDescriptors(); len(sub) > 0 {
			n, err := descriptorsNode(sub)
			if err != nil {
				return nil, err
			}
			addNode(m, "descriptors", n)
		}
		seq.Content = append(seq.Content, m)
	}
	return seq, nil
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
