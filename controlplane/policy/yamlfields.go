package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

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

// resolve follows aliases. (checkTree has bounded what they expand to.)
func resolve(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
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
	n := resolve(raw)
	if n == nil || n.Kind != yaml.MappingNode {
		p.errorf(line(raw), path, "must be a mapping, got %s", describe(n))
		return nil
	}
	size := min(len(n.Content)/2, len(allowed)) // every field past the allowed ones is an error
	out := make(map[string]field, size)
	seen := make(map[string]int, size)
	for i := 0; i+1 < len(n.Content) && !p.aborted; i += 2 {
		k := resolve(n.Content[i])
		if k.Kind != yaml.ScalarNode {
			p.errorf(line(n.Content[i]), path, "field names must be strings, got %s", describe(k))
			continue
		}
		name := k.Value
		if len(name) > MaxNameLen {
			p.errorf(k.Line, join(path, shorten(name, 40)), "unknown field (a %d-byte name)", len(name))
			continue
		}
		if k.Tag == "!!merge" {
			p.errorf(k.Line, join(path, name), "merge keys (<<) are not supported: write the fields out")
			continue
		}
		if first, dup := seen[name]; dup {
			p.errorf(k.Line, join(path, name), "repeated field (first at line %d)", first)
			continue
		}
		seen[name] = k.Line
		if !contains(allowed, name) {
			p.errorf(k.Line, join(path, name), "unknown field%s", suggest(name, allowed, hintFields, hintWhere))
			continue
		}
		if isNull(resolve(n.Content[i+1])) {
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
		return quote(n.Value)
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
	n := resolve(f.val)
	if n.Kind != yaml.ScalarNode {
		p.errorf(f.val.Line, path, "must be a string, got %s", describe(n))
		return "", false
	}
	return n.Value, true
}

// boolean returns a boolean field. YAML 1.1's yes/no/on/off are accepted
// unquoted, as envoyproxy/ratelimit's YAML library accepts them.
func (p *parser) boolean(f field, path string) (bool, bool) {
	n := resolve(f.val)
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
	n := resolve(f.val)
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
	p.errorf(f.val.Line, path, "unknown %s %s (want %s)", what, quote(s), orList(names))
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
	n := resolve(f.val)
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
