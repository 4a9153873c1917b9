package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Bounds on what a policy may ask for. Each keeps the arithmetic of the
// algorithms exact both natively (int64 nanoseconds, see shared/algorithms)
// and in the Redis Lua scripts (doubles, exact to 2^53, times in
// microseconds).
const (
	// maxRequests is the largest requests_per_unit or burst: RLS reports
	// current_limit.requests_per_unit as a uint32.
	maxRequests = math.MaxUint32
	// maxSpanNs bounds windows and the spans derived from them in
	// nanoseconds, as shared/algorithms does (2^61 ns is 73 years), so that
	// now plus a few spans cannot overflow int64.
	maxSpanNs = int64(1) << 61
	// maxLua is the largest integer a Lua double holds exactly.
	maxLua = int64(1) << 53
	// maxLuaSpanUs bounds a span added to the current time in Lua: now in
	// microseconds stays below 2^52 until the year 2112, so now plus such a
	// span stays below 2^53.
	maxLuaSpanUs = int64(1) << 52
	// weightScale is the sliding window counter's weight resolution
	// (thousandths): windows and counts are multiplied by it.
	weightScale = 1000
	// MaxSlidingLog is the largest requests_per_unit of a sliding_log limit.
	// The log keeps one entry per admitted request still in the window (a
	// Redis sorted-set member, a slot in the memory store's ring), so a
	// limit's memory and the cost of trimming the log grow with it: 100000
	// entries is a few MB per key in Redis and already far past what an
	// exact per-request log is worth. Larger limits belong to
	// sliding_window, whose memory is constant.
	MaxSlidingLog = 100000
	// maxErrors caps the errors reported for one document.
	maxErrors = 50
)

// maxNodes caps the YAML nodes visited, counting every alias expansion, so
// that a small document of nested aliases cannot make parsing explode. (A
// variable so that tests can lower it.)
var maxNodes = 1 << 20

// Field sets of each level.
var (
	domainFields     = []string{"domain", "descriptors", "failure_mode", "response_headers"}
	descriptorFields = []string{"key", "value", "rate_limit", "rate_limits", "descriptors", "shadow_mode", "detailed_metric", "value_to_metric", "failure_mode"}
	limitFields      = []string{"unit", "requests_per_unit", "unit_multiplier", "unlimited", "name", "replaces", "algorithm", "window", "burst", "max_wait"}
	replacesFields   = []string{"name"}
)

// unsupported explains the envoyproxy/ratelimit fields sluice refuses rather
// than silently ignoring, because ignoring them would change what is limited.
var unsupported = map[string]string{
	"share_threshold": "envoyproxy/ratelimit's share_threshold (one counter shared by every value a wildcard matches) is not supported",
}

// parser holds the state of one Parse.
type parser struct {
	file    string
	domain  string
	errs    ErrorList
	nodes   int
	aborted bool // stop walking: too many errors or nodes
	tooMany bool // errors were dropped

	names    map[string]nameDef // limit names defined so far
	refs     []nameRef          // replaces entries, checked once all names are known
	limits   []*Limit
	failMode FailureMode
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
	root := p.decode(data)
	if root == nil {
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
	d.limits = p.limits
	d.build()
	return d, nil
}

// yamlLine matches the line yaml.v3 puts in its syntax errors.
var yamlLine = regexp.MustCompile(`^yaml: line (\d+): `)

// decode reads the single YAML document in data and returns its root node,
// or nil after recording an error.
func (p *parser) decode(data []byte) (root *yaml.Node) {
	defer func() {
		if r := recover(); r != nil { // yaml.v3 must not take the process down
			p.errorf(0, "", "invalid YAML: %v", r)
			root = nil
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			p.errorf(0, "", "empty policy: expected a mapping with domain and descriptors")
		} else {
			p.yamlError(err)
		}
		return nil
	}
	for { // further documents are an error, unless empty (a trailing "---")
		var extra yaml.Node
		err := dec.Decode(&extra)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			p.yamlError(err)
			return nil
		}
		if len(extra.Content) > 0 && !isNull(extra.Content[0]) {
			p.errorf(extra.Line, "", "a second YAML document: put one domain per file (or per Apply)")
			return nil
		}
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
		p.errorf(doc.Line, "", "empty policy: expected a mapping with domain and descriptors")
		return nil
	}
	return doc.Content[0]
}

// yamlError records a yaml.v3 syntax error with its line.
func (p *parser) yamlError(err error) {
	msg := err.Error()
	line := 0
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		line, _ = strconv.Atoi(m[1])
		msg = msg[len(m[0]):]
	} else {
		msg = strings.TrimPrefix(msg, "yaml: ")
	}
	p.errorf(line, "", "invalid YAML: %s", msg)
}

// errorf records an error at line for field.
func (p *parser) errorf(line int, field, format string, args ...any) {
	if len(p.errs) >= maxErrors {
		p.tooMany = true
		p.aborted = true
		return
	}
	p.errs = append(p.errs, &Error{File: p.file, Line: line, Domain: p.domain, Field: field,
		Problem: fmt.Sprintf(format, args...)})
}

// resolve follows aliases and counts the node against the document's budget.
func (p *parser) resolve(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	p.nodes++
	if p.nodes > maxNodes && !p.aborted {
		p.aborted = true
		p.errs = append(p.errs, &Error{File: p.file, Domain: p.domain,
			Problem: fmt.Sprintf("document too large: more than %d YAML nodes after expanding aliases", maxNodes)})
	}
	return n
}

// field is one key of a mapping.
type field struct {
	key *yaml.Node // the key node (for its line)
	val *yaml.Node // the value as written (an alias is not yet followed)
}

// isNull reports whether n is YAML null (an empty value included).
func isNull(n *yaml.Node) bool {
	return n == nil || (n.Kind == yaml.ScalarNode && n.Tag == "!!null")
}

// join appends a field name to a path.
func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// mapping checks that n is a mapping with only allowed, non-repeated string
// keys and returns its fields by name. Fields whose value is null are left
// out, as if absent. It returns nil if n is not a mapping.
func (p *parser) mapping(raw *yaml.Node, path string, allowed []string, hintFields []string, hintWhere string) map[string]field {
	n := p.resolve(raw)
	if n == nil || n.Kind != yaml.MappingNode {
		p.errorf(line(raw), path, "must be a mapping, got %s", describe(n))
		return nil
	}
	out := make(map[string]field, len(n.Content)/2)
	seen := make(map[string]int, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content) && !p.aborted; i += 2 {
		k := p.resolve(n.Content[i])
		if k.Kind != yaml.ScalarNode {
			p.errorf(line(n.Content[i]), path, "field names must be strings, got %s", describe(k))
			continue
		}
		name := k.Value
		if k.Tag == "!!merge" {
			p.errorf(k.Line, join(path, name), "merge keys (<<) are not supported: write the fields out")
			continue
		}
		if first, dup := seen[name]; dup {
			p.errorf(k.Line, join(path, name), "repeated field (first at line %d)", first)
			continue
		}
		seen[name] = k.Line
		if why, ok := unsupported[name]; ok {
			p.errorf(k.Line, join(path, name), "%s", why)
			continue
		}
		if !contains(allowed, name) {
			p.errorf(k.Line, join(path, name), "unknown field%s", suggest(name, allowed, hintFields, hintWhere))
			continue
		}
		if isNull(p.resolve(n.Content[i+1])) {
			continue
		}
		out[name] = field{key: k, val: n.Content[i+1]}
	}
	return out
}

// line returns n's line, or 0 for nil.
func line(n *yaml.Node) int {
	if n == nil {
		return 0
	}
	return n.Line
}

// describe names a node's kind for error messages.
func describe(n *yaml.Node) string {
	if n == nil {
		return "nothing"
	}
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!null":
			return "null"
		case "!!int":
			return "the integer " + n.Value
		case "!!float":
			return "the number " + n.Value
		case "!!bool":
			return "the boolean " + n.Value
		}
		return strconv.Quote(n.Value)
	}
	return "an unsupported node"
}

// contains reports whether list holds s.
func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// suggest returns a hint for an unknown field name: the closest allowed name
// if one is within two edits, or where the field belongs if it is a field of
// another level.
func suggest(name string, allowed, other []string, where string) string {
	best, bestD := "", 3
	for _, a := range allowed {
		if d := editDistance(strings.ToLower(name), a); d < bestD {
			best, bestD = a, d
		}
	}
	if best != "" {
		return fmt.Sprintf(" (did you mean %q?)", best)
	}
	if contains(other, name) {
		return " (" + name + " belongs under " + where + ")"
	}
	return " (want one of " + strings.Join(allowed, ", ") + ")"
}

// editDistance is the Levenshtein distance between a and b (bytes).
func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 64
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			c := prev[j-1]
			if a[i-1] != b[j-1] {
				c++
			}
			cur[j] = min(c, prev[j]+1, cur[j-1]+1)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// scalar returns the text of a scalar field.
func (p *parser) scalar(f field, path string) (string, bool) {
	n := p.resolve(f.val)
	if n.Kind != yaml.ScalarNode {
		p.errorf(f.val.Line, path, "must be a string, got %s", describe(n))
		return "", false
	}
	return n.Value, true
}

// boolean returns a boolean field. YAML 1.1's yes/no/on/off are accepted
// unquoted, as envoyproxy/ratelimit's YAML library accepts them.
func (p *parser) boolean(f field, path string) (bool, bool) {
	n := p.resolve(f.val)
	if n.Kind == yaml.ScalarNode && (n.Tag == "!!bool" || n.Style&(yaml.SingleQuotedStyle|yaml.DoubleQuotedStyle) == 0) {
		switch strings.ToLower(n.Value) {
		case "true", "yes", "on", "y":
			return true, true
		case "false", "no", "off", "n":
			return false, true
		}
	}
	p.errorf(f.val.Line, path, "must be true or false, got %s", describe(n))
	return false, false
}

// integer returns an integer field.
func (p *parser) integer(f field, path string) (int64, bool) {
	n := p.resolve(f.val)
	if n.Kind == yaml.ScalarNode && n.Tag == "!!float" && isIntegerText(n.Value) {
		// YAML resolves integers beyond 64 bits as floats.
		p.errorf(f.val.Line, path, "integer out of range (got %s)", n.Value)
		return 0, false
	}
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" {
		p.errorf(f.val.Line, path, "must be an integer, got %s", describe(n))
		return 0, false
	}
	v, err := strconv.ParseInt(strings.ReplaceAll(n.Value, "_", ""), 0, 64)
	if err != nil {
		p.errorf(f.val.Line, path, "integer out of range (got %s)", n.Value)
		return 0, false
	}
	return v, true
}

// isIntegerText reports whether s is an optionally signed run of digits.
func isIntegerText(s string) bool {
	s = strings.TrimLeft(s, "+-")
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if (s[i] < '0' || s[i] > '9') && s[i] != '_' {
			return false
		}
	}
	return true
}

// choice returns a field whose value is one of names (case-insensitive).
func (p *parser) choice(f field, path, what string, names []string) (string, bool) {
	s, ok := p.scalar(f, path)
	if !ok {
		return "", false
	}
	lower := strings.ToLower(s)
	if contains(names, lower) {
		return lower, true
	}
	p.errorf(f.val.Line, path, "unknown %s %q (want %s)", what, s, orList(names))
	return "", false
}

// orList formats names as "a, b or c".
func orList(names []string) string {
	if len(names) == 1 {
		return names[0]
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// sequence returns the items of a list field.
func (p *parser) sequence(f field, path string) ([]*yaml.Node, bool) {
	n := p.resolve(f.val)
	if n.Kind != yaml.SequenceNode {
		p.errorf(f.val.Line, path, "must be a list, got %s", describe(n))
		return nil, false
	}
	return n.Content, true
}

// failureMode parses a failure_mode field.
func (p *parser) failureMode(f field, path string) (FailureMode, bool) {
	s, ok := p.choice(f, path, "failure_mode", []string{string(FailOpen), string(FailClosed)})
	return FailureMode(s), ok
}

// domainNode parses the root mapping.
func (p *parser) domainNode(root *yaml.Node) *Domain {
	p.domain = peekDomain(root) // so that every error names it, even those before it
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
	if f, ok := fs["descriptors"]; ok {
		d.Descriptors = p.descriptorList(f, "descriptors", d.FailureMode, "")
	}
	p.checkReplaces()
	return d
}

// peekDomain returns the root mapping's domain if it is a usable string.
func peekDomain(root *yaml.Node) string {
	if root.Kind != yaml.MappingNode {
		return ""
	}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.Value == "domain" && v.Kind == yaml.ScalarNode &&
			v.Tag != "!!null" && strings.IndexFunc(v.Value, isControl) < 0 {
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
	out := make([]*Descriptor, 0, len(items))
	seen := make(map[Entry]int, len(items))
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
	d := &Descriptor{Path: path}
	if f, ok := fs["key"]; !ok {
		p.errorf(line(raw), join(path, "key"), "required")
	} else if s, ok := p.scalar(f, join(path, "key")); ok {
		if s == "" {
			p.errorf(f.val.Line, join(path, "key"), "must not be empty")
		}
		d.Key = s
	}
	if f, ok := fs["value"]; ok {
		d.Value, _ = p.scalar(f, join(path, "value"))
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
		l.DetailedMetric = d.DetailedMetric
		l.ValueToMetric = d.ValueToMetric
		l.FailureMode = mode
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

// limit parses one rate_limit. It returns nil if the limit is invalid.
func (p *parser) limit(raw *yaml.Node, path string) *Limit {
	fs := p.mapping(raw, path, limitFields, descriptorFields, "the descriptor")
	if fs == nil {
		return nil
	}
	ok := true
	l := &Limit{Path: path, replacedBit: -1}
	if f, has := fs["name"]; has {
		if s, good := p.scalar(f, join(path, "name")); good {
			l.Name = s
			if first, dup := p.names[s]; dup && s != "" {
				p.errorf(f.val.Line, join(path, "name"),
					"duplicate limit name %q (first at line %d, %s): names must be unique within a domain", s, first.line, first.path)
				ok = false
			} else if s != "" {
				p.names[s] = nameDef{line: f.val.Line, path: path}
			}
		} else {
			ok = false
		}
	}
	if f, has := fs["replaces"]; has {
		if !p.replaces(f, join(path, "replaces"), l) {
			ok = false
		}
	}
	unlimited := false
	if f, has := fs["unlimited"]; has {
		var good bool
		if unlimited, good = p.boolean(f, join(path, "unlimited")); !good {
			ok = false
		}
	}
	if unlimited {
		for _, name := range []string{"unit", "unit_multiplier", "window", "algorithm", "burst", "max_wait"} {
			if f, has := fs[name]; has {
				p.errorf(f.key.Line, join(path, name), "must not be set when unlimited is true")
				ok = false
			}
		}
		if f, has := fs["requests_per_unit"]; has { // ignored, as envoyproxy/ratelimit does
			if _, good := p.integer(f, join(path, "requests_per_unit")); !good {
				ok = false
			}
		}
		l.Unlimited = true
		if !ok {
			return nil
		}
		p.limits = append(p.limits, l)
		return l
	}

	l.Algorithm = FixedWindow
	algoOK := true
	if f, has := fs["algorithm"]; has {
		names := make([]string, len(algorithmNames))
		for i, a := range algorithmNames {
			names[i] = string(a)
		}
		s, good := p.choice(f, join(path, "algorithm"), "algorithm", names)
		l.Algorithm = Algorithm(s)
		algoOK = good
		ok = ok && good
	}

	// The window: exactly one of unit and window.
	unitF, hasUnit := fs["unit"]
	winF, hasWin := fs["window"]
	windowField := join(path, "unit")
	windowOK := false
	switch {
	case hasUnit && hasWin:
		p.errorf(winF.key.Line, join(path, "window"), "unit and window are mutually exclusive: use one")
	case !hasUnit && !hasWin:
		p.errorf(line(raw), path, "needs exactly one of unit (second, minute, hour, day, week, month, year) or window (e.g. 30s, 5m, 1h30m)")
	case hasUnit:
		names := make([]string, len(unitInfo))
		for i, u := range unitInfo {
			names[i] = u.name
		}
		if s, good := p.choice(unitF, windowField, "unit", names); good {
			for _, u := range unitInfo {
				if u.name == s {
					l.Window, l.Unit = u.d, u.unit
				}
			}
			windowOK = true
		}
		if f, has := fs["unit_multiplier"]; has && windowOK {
			mpath := join(path, "unit_multiplier")
			m, good := p.integer(f, mpath)
			switch {
			case !good:
				windowOK = false
			case m < 1:
				p.errorf(f.val.Line, mpath, "must be >= 1 (got %d)", m)
				windowOK = false
			case m > maxSpanNs/int64(l.Window):
				p.errorf(f.val.Line, mpath, "too large: unit x unit_multiplier must be at most %s (got %d x %s)",
					time.Duration(maxSpanNs), m, l.Window)
				windowOK = false
			default:
				l.Window *= time.Duration(m)
				l.Unit = unitOf(l.Window)
				windowField = mpath
			}
		}
	case hasWin:
		windowField = join(path, "window")
		if f, has := fs["unit_multiplier"]; has {
			p.errorf(f.key.Line, join(path, "unit_multiplier"), "applies to unit only: with window, write the whole duration")
		} else if w, good := p.window(winF, windowField); good {
			l.Window, l.Unit = w, unitOf(w)
			windowOK = true
		}
	}
	ok = ok && windowOK

	requestsOK := false
	if f, has := fs["requests_per_unit"]; !has {
		p.errorf(line(raw), join(path, "requests_per_unit"), "required (or set unlimited: true)")
	} else if v, good := p.integer(f, join(path, "requests_per_unit")); good {
		switch {
		case v == 0 && algoOK && l.Algorithm != FixedWindow:
			p.errorf(f.val.Line, join(path, "requests_per_unit"),
				"0 (refuse every request, as envoyproxy/ratelimit reads it) is only accepted with fixed_window (algorithm is %s)", l.Algorithm)
		case v == 0:
			// envoyproxy/ratelimit's "block": every request is refused and
			// nothing is counted.
			requestsOK = true
		case v < 0:
			p.errorf(f.val.Line, join(path, "requests_per_unit"), "must be > 0 (got %d)", v)
		case v > maxRequests:
			p.errorf(f.val.Line, join(path, "requests_per_unit"),
				"must be at most %d (RLS reports it as a uint32; got %d)", int64(maxRequests), v)
		default:
			l.Requests = v
			requestsOK = true
		}
	}
	ok = ok && requestsOK

	burstF, hasBurst := fs["burst"]
	burstOK := true
	if hasBurst {
		burstOK = false
		switch v, good := p.integer(burstF, join(path, "burst")); {
		case !good:
		case algoOK && !l.Algorithm.HasBurst():
			p.errorf(burstF.key.Line, join(path, "burst"),
				"only token_bucket, gcra and reserve take a burst (algorithm is %s)", l.Algorithm)
		case v < 1:
			p.errorf(burstF.val.Line, join(path, "burst"), "must be >= 1 (got %d)", v)
		case v > maxRequests:
			p.errorf(burstF.val.Line, join(path, "burst"), "must be at most %d (got %d)", int64(maxRequests), v)
		default:
			l.Burst = v
			burstOK = true
		}
	} else if l.Algorithm.HasBurst() {
		l.Burst = l.Requests
	}
	ok = ok && burstOK
	ok = p.maxWait(l, fs, line(raw), path, algoOK) && ok

	if !ok || !algoOK {
		return nil
	}
	burstLine, burstField := line(raw), path
	if hasBurst {
		burstLine, burstField = burstF.val.Line, join(path, "burst")
	}
	winLine := unitF.val
	if hasWin {
		winLine = winF.val
	} else if f, has := fs["unit_multiplier"]; has {
		winLine = f.val
	}
	if !p.checkBounds(l, path, windowField, winLine.Line, burstField, burstLine, fs) {
		return nil
	}
	p.limits = append(p.limits, l)
	return l
}

// window parses a window duration: positive, whole microseconds.
func (p *parser) window(f field, path string) (time.Duration, bool) {
	n := p.resolve(f.val)
	if n.Kind != yaml.ScalarNode || n.Tag == "!!int" || n.Tag == "!!float" {
		p.errorf(f.val.Line, path, "must be a duration with a unit, e.g. 30s, 5m or 1h30m (got %s)", describe(n))
		return 0, false
	}
	w, err := time.ParseDuration(n.Value)
	if err != nil {
		p.errorf(f.val.Line, path, "not a duration: %q (use ns, us, ms, s, m or h, e.g. 30s, 5m, 1h30m, 24h)", n.Value)
		return 0, false
	}
	if w <= 0 {
		p.errorf(f.val.Line, path, "must be > 0 (got %s)", n.Value)
		return 0, false
	}
	if w%time.Microsecond != 0 {
		p.errorf(f.val.Line, path, "must be a whole number of microseconds, the resolution of the Redis clock (got %s)", n.Value)
		return 0, false
	}
	return w, true
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

// checkBounds checks the limits that keep each algorithm's arithmetic exact
// natively (nanoseconds, int64) and in Redis Lua (microseconds, doubles),
// then asks shared/algorithms to validate the parameters in both forms.
func (p *parser) checkBounds(l *Limit, path, winField string, winLine int, burstField string, burstLine int, fs map[string]field) bool {
	if l.Requests == 0 {
		return true // refuses everything: no algorithm arithmetic to keep exact
	}
	reqField := join(path, "requests_per_unit")
	reqLine := fs["requests_per_unit"].val.Line
	ns := int64(l.Window)
	us := ns / int64(time.Microsecond)
	if ns > maxSpanNs {
		p.errorf(winLine, winField, "must be at most %s (2^61 ns, the algorithms' time span bound; got %s)",
			time.Duration(maxSpanNs), l.Window)
		return false
	}
	switch l.Algorithm {
	case SlidingWindow:
		// The weighted count multiplies the window and the counts by 1000.
		if ns > maxSpanNs/weightScale || us > maxLua/weightScale {
			p.errorf(winLine, winField,
				"sliding_window: must be at most %s (window x 1000 must stay within 2^61 ns; got %s); use fixed_window or token_bucket for longer windows",
				time.Duration(maxSpanNs/weightScale), l.Window)
			return false
		}
		if l.Requests > maxLua/weightScale {
			p.errorf(reqLine, reqField, "sliding_window: must be at most %d (requests x 1000 must stay within 2^53; got %d)",
				maxLua/weightScale, l.Requests)
			return false
		}
	case SlidingLog:
		if l.Requests > MaxSlidingLog {
			p.errorf(reqLine, reqField,
				"sliding_log keeps one entry per admitted request: at most %d (got %d); use sliding_window for larger limits",
				MaxSlidingLog, l.Requests)
			return false
		}
	case TokenBucket, Reserve:
		// The bucket holds burst x window units (1/window of a token
		// each). The native bound (2^61 ns) implies the Lua one (2^53 µs).
		if l.Burst > maxSpanNs/ns || l.Burst > maxLua/us {
			p.errorf(burstLine, burstField,
				"%s: burst x window must be at most %s (2^61 ns) so the bucket arithmetic stays exact (got %d x %s); lower burst or window",
				l.Algorithm, time.Duration(maxSpanNs), l.Burst, l.Window)
			return false
		}
	case GCRA:
		// The emission interval window/requests must be at least one time
		// unit of the Lua clock (a microsecond). burst x interval is the
		// delay variation tolerance, added to the current time: the native
		// bound (2^61 ns) implies the Lua one (now + it < 2^53 µs).
		if us/l.Requests < 1 {
			p.errorf(reqLine, reqField,
				"gcra: at most one request per microsecond of window (the emission interval window/requests must be >= 1µs; got %d per %s)",
				l.Requests, l.Window)
			return false
		}
		ivNs, ivUs := ns/l.Requests, us/l.Requests
		if l.Burst > maxSpanNs/ivNs || l.Burst > maxLuaSpanUs/ivUs {
			p.errorf(burstLine, burstField,
				"gcra: burst x emission interval (window/requests) must be at most %s (2^61 ns) so the arithmetic stays exact (got %d x %s); lower burst or window",
				time.Duration(maxSpanNs), l.Burst, time.Duration(ivNs))
			return false
		}
	}
	for _, unit := range []time.Duration{time.Nanosecond, time.Microsecond} {
		if err := l.validate(unit); err != nil {
			p.errorf(reqLine, path, "rejected by the %s algorithm (times in %s): %v", l.Algorithm, unit, err)
			return false
		}
	}
	return true
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
