package policy

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// Field sets of each level.
var (
	domainFields     = []string{"domain", "descriptors", "failure_mode", "response_headers", "lease"}
	descriptorFields = []string{"key", "value", "rate_limit", "rate_limits", "descriptors", "shadow_mode", "detailed_metric", "value_to_metric", "failure_mode", "share_threshold", "quota_mode", "metadata", "charge_past_limit"}
	limitFields      = []string{"unit", "requests_per_unit", "unit_multiplier", "unlimited", "name", "replaces", "algorithm", "window", "burst", "max_wait", "calendar"}
	replacesFields   = []string{"name"}
)

// parser holds the state of one Parse.
type parser struct {
	file    string
	domain  string
	errs    ErrorList
	aborted bool // stop walking: too many errors or nodes
	tooMany bool // errors were dropped

	descriptors int                // descriptors parsed so far, aliases expanded
	names       map[string]nameDef // limit names defined so far
	refs        []nameRef          // replaces entries, checked once all names are known
	limits      []*Limit
	failMode    FailureMode
	lease       bool // the domain's lease: auto
}

// nameDef is where a limit name was defined.
type nameDef struct {
	line int
	path string
}

// nameRef is one replaces entry.
type nameRef struct {
	name  string
	line  int
	field string
}

// Parse parses and validates one policy document: one domain. name is used
// in error messages (a file path, or the domain pushed over the API). On
// failure the error is an ErrorList naming every problem found (up to 50)
// with line and field.
func Parse(name string, data []byte) (*Domain, error) {
	p := &parser{file: name, names: map[string]nameDef{}}
	if !p.checkDocument(data) {
		return nil, p.errs
	}
	root := p.decode(data)
	if root == nil {
		return nil, p.errs
	}
	d, err := p.parseRoot(root)
	if err != nil {
		return nil, err
	}
	d.text = data
	return d, nil
}

// ParseNode parses a policy built as YAML nodes by a program rather than
// read from a document (an xDS resource): the checks and errors of Parse,
// without the text's (its size, its encoding, its lines). The caller
// bounds what it builds: root is not copied, and is walked in full.
func ParseNode(name string, root *yaml.Node) (*Domain, error) {
	p := &parser{file: name, names: map[string]nameDef{}}
	return p.parseRoot(root)
}

// parseRoot parses the root node of a policy.
func (p *parser) parseRoot(root *yaml.Node) (*Domain, error) {
	name := p.file
	p.domain = peekDomain(root) // so that every error names it, even those before it
	if !p.checkTree(root) {
		return nil, p.errs
	}
	d := p.domainNode(root)
	if len(p.errs) > 0 {
		sort.SliceStable(p.errs, func(i, j int) bool { return p.errs[i].Line < p.errs[j].Line })
		if p.tooMany {
			p.errs = append(p.errs, &Error{File: p.file, Domain: p.domain, Problem: "too many errors; stopping here"})
		}
		return nil, p.errs
	}
	d.Source = name
	d.descriptors = p.descriptors
	d.limits = p.limits
	d.build()
	return d, nil
}

// domainNode parses the root mapping.
func (p *parser) domainNode(root *yaml.Node) *Domain {
	fs := p.mapping(root, "", domainFields, descriptorFields, "descriptors")
	if fs == nil {
		return nil
	}
	p.domain = ""
	d := &Domain{FailureMode: FailOpen}
	if f, ok := fs["domain"]; !ok {
		p.errorf(line(root), "domain", "required: name the domain the descriptors belong to")
	} else if s, ok := p.scalar(f, "domain"); ok {
		switch {
		case s == "":
			p.errorf(f.val.Line, "domain", "must not be empty")
		case !p.checkLen(f, "domain", s, MaxNameLen):
		case strings.IndexFunc(s, isControl) >= 0:
			p.errorf(f.val.Line, "domain", "must not contain control characters (got %q)", s)
		default:
			d.Name = s
			d.nameLine = f.val.Line
			p.domain = s
		}
	}
	if f, ok := fs["failure_mode"]; ok {
		if m, ok := p.failureMode(f, "failure_mode"); ok {
			d.FailureMode = m
		}
	}
	p.failMode = d.FailureMode
	if f, ok := fs["response_headers"]; ok {
		d.ResponseHeaders, _ = p.boolean(f, "response_headers")
	}
	if f, ok := fs["lease"]; ok {
		s, _ := p.choice(f, "lease", "lease", []string{string(LeaseAuto), string(LeaseOff)})
		d.Lease = LeaseMode(s) == LeaseAuto
	}
	p.lease = d.Lease
	if f, ok := fs["descriptors"]; ok {
		d.Descriptors = p.descriptorList(f, "descriptors", d.FailureMode, "")
	}
	p.checkReplaces()
	return d
}

// PeekDomain returns the domain a policy document names, reading no
// further than its top-level domain field: "" when the document is not
// YAML within the size bound, or names no domain that Parse would accept.
// It validates nothing else (Parse does).
func PeekDomain(data []byte) string {
	p := &parser{}
	if !p.checkDocument(data) {
		return ""
	}
	root := p.decode(data)
	if root == nil {
		return ""
	}
	return peekDomain(root)
}

// peekDomain returns the root mapping's domain if it is a usable string.
func peekDomain(root *yaml.Node) string {
	if root.Kind != yaml.MappingNode {
		return ""
	}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.Value == "domain" && v.Kind == yaml.ScalarNode &&
			v.Tag != "!!null" && len(v.Value) <= MaxNameLen && strings.IndexFunc(v.Value, isControl) < 0 {
			return v.Value
		}
	}
	return ""
}

// isControl reports whether r is a control character.
func isControl(r rune) bool { return r < 0x20 || r == 0x7f }

// descriptorList parses a descriptors list and checks that siblings differ.
func (p *parser) descriptorList(f field, path string, parentMode FailureMode, idPrefix string) []*Descriptor {
	items, ok := p.sequence(f, path)
	if !ok {
		return nil
	}
	// Not sized by len(items): a list of 500,000 scalars stops after 50
	// errors, and must not cost a map of 500,000 first.
	var out []*Descriptor
	seen := make(map[Entry]int)
	for i, item := range items {
		if p.aborted {
			break
		}
		ipath := fmt.Sprintf("%s[%d]", path, i)
		d := p.descriptor(item, ipath, parentMode, idPrefix)
		if d == nil {
			continue
		}
		e := Entry{d.Key, d.Value}
		if first, dup := seen[e]; dup {
			what := fmt.Sprintf("key %q", d.Key)
			if d.Value != "" {
				what += fmt.Sprintf(" value %q", d.Value)
			}
			p.errorf(line(item), ipath, "duplicate descriptor %s (first at line %d)", what, first)
			continue
		}
		seen[e] = line(item)
		out = append(out, d)
	}
	return out
}

// descriptor parses one descriptor and, recursively, its children. It
// returns nil if the descriptor has no usable key.
func (p *parser) descriptor(raw *yaml.Node, path string, parentMode FailureMode, idPrefix string) *Descriptor {
	fs := p.mapping(raw, path, descriptorFields, limitFields, "rate_limit")
	if fs == nil {
		return nil
	}
	if p.descriptors++; p.descriptors > MaxDescriptors {
		p.errorf(line(raw), path, "too many descriptors: more than %d (aliases expanded), at most %d in all the domains together: %s",
			MaxDescriptors, MaxDescriptors, boundHint)
		p.aborted = true
		return nil
	}
	d := &Descriptor{Path: path}
	if f, ok := fs["key"]; !ok {
		p.errorf(line(raw), join(path, "key"), "required")
	} else if s, ok := p.scalar(f, join(path, "key")); ok {
		if s == "" {
			p.errorf(f.val.Line, join(path, "key"), "must not be empty")
		}
		if p.checkLen(f, join(path, "key"), s, MaxNameLen) {
			d.Key = s
		}
	}
	if f, ok := fs["value"]; ok {
		if s, ok := p.scalar(f, join(path, "value")); ok && p.checkLen(f, join(path, "value"), s, MaxValueLen) {
			d.Value = s
		}
	}
	if f, ok := fs["shadow_mode"]; ok {
		d.ShadowMode, _ = p.boolean(f, join(path, "shadow_mode"))
	}
	if f, ok := fs["detailed_metric"]; ok {
		d.DetailedMetric, _ = p.boolean(f, join(path, "detailed_metric"))
	}
	if f, ok := fs["value_to_metric"]; ok {
		d.ValueToMetric, _ = p.boolean(f, join(path, "value_to_metric"))
	}
	if f, ok := fs["share_threshold"]; ok {
		if d.ShareThreshold, _ = p.boolean(f, join(path, "share_threshold")); d.ShareThreshold && !strings.Contains(d.Value, "*") {
			p.errorf(f.key.Line, join(path, "share_threshold"),
				"needs a wildcard value (containing *): every value the wildcard matches then shares one counter (value is %s)", quote(d.Value))
		}
	}
	if f, ok := fs["quota_mode"]; ok {
		d.QuotaMode, _ = p.boolean(f, join(path, "quota_mode"))
	}
	if f, ok := fs["charge_past_limit"]; ok {
		d.ChargePastLimit, _ = p.boolean(f, join(path, "charge_past_limit"))
	}
	if f, ok := fs["metadata"]; ok {
		d.Metadata = p.metadata(f, join(path, "metadata"))
	}
	mode := parentMode
	if f, ok := fs["failure_mode"]; ok {
		if m, ok := p.failureMode(f, join(path, "failure_mode")); ok {
			d.FailureMode = m
			mode = m
		}
	}
	id := escapeID(d.Key)
	if d.Value != "" {
		id += "=" + escapeID(d.Value)
	}
	if idPrefix != "" {
		id = idPrefix + "/" + id
	}

	single, hasSingle := fs["rate_limit"]
	list, hasList := fs["rate_limits"]
	switch {
	case hasSingle && hasList:
		p.errorf(list.key.Line, join(path, "rate_limits"),
			"rate_limit and rate_limits are mutually exclusive: put every limit under rate_limits")
	case hasSingle:
		if l := p.limit(single.val, join(path, "rate_limit")); l != nil {
			d.Limits = []*Limit{l}
		}
	case hasList:
		if items, ok := p.sequence(list, join(path, "rate_limits")); ok {
			for i, item := range items {
				if p.aborted {
					break
				}
				if l := p.limit(item, fmt.Sprintf("%s[%d]", join(path, "rate_limits"), i)); l != nil {
					d.Limits = append(d.Limits, l)
				}
			}
			if len(d.Limits) > 1 {
				for _, l := range d.Limits {
					if l.Unlimited {
						p.errorf(line(list.val), join(path, "rate_limits"),
							"an unlimited limit must be the only limit of its descriptor")
						break
					}
				}
			}
		}
	}
	for i, l := range d.Limits {
		l.ShadowMode = d.ShadowMode
		l.QuotaMode = d.QuotaMode
		l.ChargePastLimit = d.ChargePastLimit
		l.Metadata = d.Metadata
		l.DetailedMetric = d.DetailedMetric
		l.ValueToMetric = d.ValueToMetric
		l.FailureMode = mode
		l.Lease = p.lease
		l.ID = id + "#" + strconv.Itoa(i)
		l.Domain = p.domain
	}
	if f, ok := fs["descriptors"]; ok {
		d.Descriptors = p.descriptorList(f, join(path, "descriptors"), mode, id)
	}
	if d.Key == "" {
		return nil
	}
	return d
}

// metadata parses a descriptor's metadata: any mapping, kept as a protobuf
// Struct (numbers become doubles), as envoyproxy/ratelimit keeps it.
func (p *parser) metadata(f field, path string) *structpb.Struct {
	n := resolve(f.val)
	if n == nil || n.Kind != yaml.MappingNode {
		p.errorf(line(f.val), path, "must be a mapping, got %s", describe(n))
		return nil
	}
	if !p.checkMetadata(n, path) {
		return nil
	}
	var m map[string]any
	if err := n.Decode(&m); err != nil {
		p.errorf(line(f.val), path, "%v", err)
		return nil
	}
	if len(m) == 0 {
		return nil
	}
	st, err := structpb.NewStruct(m)
	if err != nil {
		p.errorf(line(f.val), path, "cannot be dynamic metadata: %v (keys must be strings; values strings, numbers, booleans, null, lists or mappings)", err)
		return nil
	}
	return st
}

// replaces parses a replaces list into l.Replaces and records the names for
// checking once all limits are known.
func (p *parser) replaces(f field, path string, l *Limit) bool {
	items, ok := p.sequence(f, path)
	if !ok {
		return false
	}
	for i, item := range items {
		ipath := fmt.Sprintf("%s[%d]", path, i)
		fs := p.mapping(item, ipath, replacesFields, nil, "")
		if fs == nil {
			ok = false
			continue
		}
		nf, has := fs["name"]
		if !has {
			p.errorf(line(item), join(ipath, "name"), "required: the name of the limit to replace")
			ok = false
			continue
		}
		s, good := p.scalar(nf, join(ipath, "name"))
		switch {
		case !good:
			ok = false
		case s == "":
			p.errorf(nf.val.Line, join(ipath, "name"), "must not be empty")
			ok = false
		case !p.checkLen(nf, join(ipath, "name"), s, MaxNameLen):
			ok = false
		case s == l.Name:
			p.errorf(nf.val.Line, join(ipath, "name"), "a limit cannot replace itself (%q)", s)
			ok = false
		default:
			l.Replaces = append(l.Replaces, s)
			p.refs = append(p.refs, nameRef{name: s, line: nf.val.Line, field: join(ipath, "name")})
		}
	}
	return ok
}

// checkReplaces reports replaces entries naming no limit of the domain.
func (p *parser) checkReplaces() {
	for _, r := range p.refs {
		if _, ok := p.names[r.name]; !ok {
			p.errorf(r.line, r.field, "unknown limit name %q: no rate_limit in this domain has that name", r.name)
		}
	}
}

// escapeID escapes the bytes that structure an ID ('%', '/', '=', '#') and
// control bytes as %XX.
func escapeID(s string) string {
	clean := true
	for i := 0; i < len(s); i++ {
		if needsEscape(s[i]) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if needsEscape(c) {
			fmt.Fprintf(&b, "%%%02X", c)
		} else {
			b.WriteByte(c)
		}
	}
	return b.String()
}

// needsEscape reports whether c is escaped in IDs.
func needsEscape(c byte) bool {
	return c == '%' || c == '/' || c == '=' || c == '#' || c < 0x20 || c == 0x7f
}
