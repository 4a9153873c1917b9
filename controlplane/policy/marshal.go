package policy

import (
	"bytes"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/algorithms"
)

// Marshal writes d back as YAML in canonical form: fields in a fixed order,
// defaults left out (failure_mode open, algorithm fixed_window, burst equal to
// requests_per_unit, false switches), a single limit as rate_limit and several
// as rate_limits, and unit for windows that are one whole unit (else window).
// A domain that uses none of sluice's extensions comes out as a valid
// envoyproxy/ratelimit file. Parse(name, Marshal(d)) yields a domain Equal to
// d.
func Marshal(d *Domain) ([]byte, error) {
	root := mapNode()
	addStr(root, "domain", d.Name)
	if d.FailureMode == FailClosed {
		addStr(root, "failure_mode", string(d.FailureMode))
	}
	if d.ResponseHeaders {
		addBool(root, "response_headers", true)
	}
	if d.Lease {
		addStr(root, "lease", string(LeaseAuto))
	}
	if len(d.Descriptors) > 0 {
		addNode(root, "descriptors", descriptorsNode(d.Descriptors))
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(root); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// descriptorsNode writes a descriptors list.
func descriptorsNode(ds []*Descriptor) *yaml.Node {
	seq := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
	for _, d := range ds {
		m := mapNode()
		addStr(m, "key", d.Key)
		if d.Value != "" {
			addStr(m, "value", d.Value)
		}
		if d.FailureMode != "" {
			addStr(m, "failure_mode", string(d.FailureMode))
		}
		if d.ShadowMode {
			addBool(m, "shadow_mode", true)
		}
		if d.DetailedMetric {
			addBool(m, "detailed_metric", true)
		}
		if d.ValueToMetric {
			addBool(m, "value_to_metric", true)
		}
		if d.ShareThreshold {
			addBool(m, "share_threshold", true)
		}
		if d.QuotaMode {
			addBool(m, "quota_mode", true)
		}
		if d.ChargePastLimit {
			addBool(m, "charge_past_limit", true)
		}
		if d.Metadata != nil {
			var md yaml.Node
			if err := md.Encode(d.Metadata.AsMap()); err == nil {
				addNode(m, "metadata", &md)
			}
		}
		switch len(d.Limits) {
		case 0:
		case 1:
			addNode(m, "rate_limit", limitNode(d.Limits[0]))
		default:
			list := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
			for _, l := range d.Limits {
				list.Content = append(list.Content, limitNode(l))
			}
			addNode(m, "rate_limits", list)
		}
		if len(d.Descriptors) > 0 {
			addNode(m, "descriptors", descriptorsNode(d.Descriptors))
		}
		seq.Content = append(seq.Content, m)
	}
	return seq
}

// limitNode writes one limit.
func limitNode(l *Limit) *yaml.Node {
	m := mapNode()
	if l.Name != "" {
		addStr(m, "name", l.Name)
	}
	if l.Unlimited {
		addBool(m, "unlimited", true)
	} else {
		if l.Algorithm != algorithms.KindFixedWindow {
			addStr(m, "algorithm", l.Algorithm.String())
		}
		if u := unitOf(l.Window); u != algorithms.UnitUnknown {
			addStr(m, "unit", u.Name())
		} else {
			addStr(m, "window", formatDuration(l.Window))
		}
		if l.Calendar != nil {
			addStr(m, "calendar", l.Calendar.Zone())
		}
		addInt(m, "requests_per_unit", l.Requests)
		if l.Algorithm.HasBurst() && l.Burst != l.Requests {
			addInt(m, "burst", l.Burst)
		}
		if l.Algorithm == algorithms.KindReserve {
			addStr(m, "max_wait", formatDuration(l.MaxWait))
		}
	}
	if len(l.Replaces) > 0 {
		seq := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		for _, r := range l.Replaces {
			e := mapNode()
			addStr(e, "name", r)
			seq.Content = append(seq.Content, e)
		}
		addNode(m, "replaces", seq)
	}
	return m
}

// formatDuration writes d the way time.ParseDuration reads it, with "us"
// rather than "µs" so the output stays ASCII.
func formatDuration(d time.Duration) string {
	if d%time.Millisecond != 0 && d < time.Second {
		return strconv.FormatInt(int64(d/time.Microsecond), 10) + "us"
	}
	return d.String()
}

// mapNode returns an empty block mapping.
func mapNode() *yaml.Node { return &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"} }

// addNode appends key: v to mapping m.
func addNode(m *yaml.Node, key string, v *yaml.Node) {
	m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: key}, v)
}

// addStr appends key: s. The encoder quotes s if YAML 1.2 would read it back
// as something other than a string; YAML 1.1's booleans (yes, no, on, off,
// y, n), which envoyproxy/ratelimit's YAML library would read as booleans,
// are quoted too.
func addStr(m *yaml.Node, key, s string) {
	n := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s}
	switch strings.ToLower(s) {
	case "y", "yes", "n", "no", "on", "off":
		n.Style = yaml.DoubleQuotedStyle
	}
	addNode(m, key, n)
}

// addInt appends key: n.
func addInt(m *yaml.Node, key string, n int64) {
	addNode(m, key, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.FormatInt(n, 10)})
}

// addBool appends key: b.
func addBool(m *yaml.Node, key string, b bool) {
	addNode(m, key, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: strconv.FormatBool(b)})
}

// Equal reports whether d and o are the same policy: same name, settings,
// descriptors and limits, IDs included. Where they were written (Source and
// the Path fields) is ignored.
func (d *Domain) Equal(o *Domain) bool {
	if d == nil || o == nil {
		return d == o
	}
	return d.Name == o.Name && d.FailureMode == o.FailureMode && d.ResponseHeaders == o.ResponseHeaders && d.Lease == o.Lease &&
		descriptorsEqual(d.Descriptors, o.Descriptors)
}

// descriptorsEqual compares descriptor lists in order.
func descriptorsEqual(a, b []*Descriptor) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if x.Key != y.Key || x.Value != y.Value || x.ShadowMode != y.ShadowMode ||
			x.DetailedMetric != y.DetailedMetric || x.ValueToMetric != y.ValueToMetric || x.FailureMode != y.FailureMode ||
			x.ShareThreshold != y.ShareThreshold || x.QuotaMode != y.QuotaMode || x.ChargePastLimit != y.ChargePastLimit ||
			!proto.Equal(x.Metadata, y.Metadata) ||
			len(x.Limits) != len(y.Limits) || !descriptorsEqual(x.Descriptors, y.Descriptors) {
			return false
		}
		for j := range x.Limits {
			if !limitEqual(x.Limits[j], y.Limits[j]) {
				return false
			}
		}
	}
	return true
}

// limitEqual compares the exported fields of two limits.
func limitEqual(a, b *Limit) bool {
	if a.Name != b.Name || a.Algorithm != b.Algorithm || a.Requests != b.Requests || a.Window != b.Window || a.Calendar != b.Calendar ||
		a.Unit != b.Unit || a.Burst != b.Burst || a.MaxWait != b.MaxWait || a.Unlimited != b.Unlimited || a.ShadowMode != b.ShadowMode ||
		a.DetailedMetric != b.DetailedMetric || a.ValueToMetric != b.ValueToMetric || a.QuotaMode != b.QuotaMode || a.ChargePastLimit != b.ChargePastLimit || a.FailureMode != b.FailureMode || a.ID != b.ID || a.Lease != b.Lease ||
		a.Domain != b.Domain || len(a.Replaces) != len(b.Replaces) || !slices.Equal(a.SharedValues, b.SharedValues) {
		return false
	}
	for i := range a.Replaces {
		if a.Replaces[i] != b.Replaces[i] {
			return false
		}
	}
	return true
}
