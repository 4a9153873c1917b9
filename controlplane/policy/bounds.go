package policy

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// Bounds on a policy document. Parse applies them, so they hold the same
// for every way a policy arrives: a -policy file at start-up or on SIGHUP,
// and an Apply through the policy service.
const (
	// MaxDocumentSize is the largest policy document, in bytes. A real
	// policy is a few kilobytes; a larger set is split into domains.
	MaxDocumentSize = 1 << 20
	// MaxDepth is how deeply the YAML of a policy may nest, counting every
	// mapping and list (the document's root mapping is level 1). Each level
	// of descriptors takes two (its list and its mapping), and a limit
	// needs three more, so 128 allows about 60 levels of descriptors: a
	// descriptor of n levels matches a request descriptor of n entries,
	// and Envoy's route rate_limits build a handful. Parsing costs grow with
	// depth (each error names the path), so the cap keeps a 1 MiB document
	// cheap.
	MaxDepth = 128
	// MaxNameLen is the longest domain, descriptor key, limit name or field
	// name, in bytes. Names appear in every error message, log line and
	// metric label that concerns them.
	MaxNameLen = 256
	// MaxValueLen is the longest descriptor value, in bytes: an exact value
	// or a wildcard prefix (a path, a header's value).
	MaxValueLen = 1024
	// MaxMetadataKeys is the most keys of one mapping in a descriptor's
	// metadata. YAML's check for duplicate keys costs the square of a
	// mapping's keys: 80,000 keys (1 MiB) took 30 s.
	MaxMetadataKeys = 256
)

// maxNodes caps the YAML nodes of a document, counting every node an alias
// expands to, so that a small document of nested aliases cannot make
// parsing explode. A 1 MiB document has at most about 500,000 nodes
// written out. (A variable so that tests can lower it.)
var maxNodes int64 = 1 << 20

// checkDocument checks the bytes of a document before YAML reads them: size
// and encoding.
func (p *parser) checkDocument(data []byte) bool {
	switch {
	case len(data) > MaxDocumentSize:
		p.errorf(0, "", "policy too large: %d bytes (at most %d): split it into several domains", len(data), MaxDocumentSize)
	case !utf8.Valid(data):
		p.errorf(0, "", "not valid UTF-8 text")
	default:
		return true
	}
	return false
}

// checkTree checks the YAML tree of a document as the parser will walk it,
// with every alias expanded, but without expanding any: an alias that
// refers to a node containing it (a cycle), nesting deeper than MaxDepth,
// or more than maxNodes nodes after expansion is an error naming the line
// and field where it happens. It visits each node once, so it costs what
// the document costs written out, however much its aliases expand to.
func (p *parser) checkTree(root *yaml.Node) bool {
	t := &treeCheck{p: p, anchored: map[*yaml.Node]subtree{}, open: map[*yaml.Node]bool{}}
	t.visit(root, 1)
	return !t.failed
}

// subtree is the expanded size of an anchored node.
type subtree struct {
	nodes  int64 // nodes after expanding aliases, at most maxNodes+1
	height int   // levels below and including the node
}

// treeCheck is the state of one checkTree.
type treeCheck struct {
	p        *parser
	anchored map[*yaml.Node]subtree // anchored nodes already measured
	open     map[*yaml.Node]bool    // anchored nodes being visited (the path from the root)
	nodes    int64                  // nodes counted so far
	path     []segment              // field path of the node being visited
	failed   bool
}

// segment is one step of a field path: a mapping key, or a list index when
// key is nil.
type segment struct {
	key   *yaml.Node
	index int
}

// visit counts n and everything below it at depth, and returns the height
// of n's subtree.
func (t *treeCheck) visit(n *yaml.Node, depth int) int {
	if t.failed || n == nil {
		return 0
	}
	if n.Kind == yaml.AliasNode {
		target := n.Alias
		if target == nil {
			return 0
		}
		if t.open[target] {
			t.fail(n, "alias *%s refers to a node that contains it (anchor &%s, line %d): aliases must not form a cycle",
				n.Value, target.Anchor, target.Line)
			return 0
		}
		sub, ok := t.anchored[target]
		if !ok { // not reached through its anchor (cannot happen in YAML: anchors come first)
			return t.visit(target, depth)
		}
		return t.add(n, depth, sub)
	}
	if depth > MaxDepth {
		t.fail(n, "nested too deeply: more than %d levels of YAML (about 60 levels of descriptors)", MaxDepth)
		return 0
	}
	before := t.nodes
	t.nodes++
	if n.Anchor != "" {
		t.open[n] = true
		defer delete(t.open, n)
	}
	height := 0
	for i, c := range n.Content {
		switch n.Kind {
		case yaml.MappingNode:
			if i%2 == 0 {
				t.path = append(t.path, segment{key: c})
			}
		case yaml.SequenceNode:
			t.path = append(t.path, segment{index: i})
		}
		height = max(height, t.visit(c, depth+1))
		if n.Kind == yaml.SequenceNode || (n.Kind == yaml.MappingNode && i%2 == 1) {
			t.path = t.path[:len(t.path)-1]
		}
		if t.failed {
			return 0
		}
	}
	if n.Anchor != "" {
		t.anchored[n] = subtree{nodes: t.nodes - before, height: height + 1}
	}
	if t.nodes > maxNodes {
		t.fail(n, "document too large: more than %d YAML nodes after expanding aliases", maxNodes)
	}
	return height + 1
}

// add counts an alias to an anchored subtree of known size at depth.
func (t *treeCheck) add(alias *yaml.Node, depth int, sub subtree) int {
	switch {
	case depth+sub.height-1 > MaxDepth:
		t.fail(alias, "nested too deeply: alias *%s expands to more than %d levels of YAML (about 60 levels of descriptors)",
			alias.Value, MaxDepth)
	case sub.nodes > maxNodes-t.nodes:
		t.fail(alias, "document too large: alias *%s takes it past %d YAML nodes after expanding aliases", alias.Value, maxNodes)
	default:
		t.nodes += sub.nodes
	}
	return sub.height
}

// fail records the check's one error at n.
func (t *treeCheck) fail(n *yaml.Node, format string, args ...any) {
	t.failed = true
	t.p.errorf(n.Line, shortPath(t.path), format, args...)
	t.p.aborted = true
}

// text is the segment as written in a field path.
func (s segment) text() string {
	switch {
	case s.key == nil:
		return "[" + strconv.Itoa(s.index) + "]"
	case s.key.Kind == yaml.ScalarNode:
		return "." + shorten(s.key.Value, 40)
	}
	return ".?"
}

// shortPath joins a field path, leaving out the middle of a deep one.
func shortPath(segs []segment) string {
	const ends = 4
	var b strings.Builder
	for i, s := range segs {
		switch {
		case len(segs) > 2*ends && i == ends:
			fmt.Fprintf(&b, ".(%d more levels)", len(segs)-2*ends)
		case len(segs) > 2*ends && i > ends && i < len(segs)-ends:
		default:
			b.WriteString(s.text())
		}
	}
	return strings.TrimPrefix(b.String(), ".")
}

// shorten returns s cut to at most n bytes (between characters), marking a
// cut with "...".
func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "..."
}

// quote quotes s for an error message, cut to 64 bytes.
func quote(s string) string {
	if len(s) <= 64 {
		return strconv.Quote(s)
	}
	return strconv.Quote(shorten(s, 64)) + fmt.Sprintf(" (%d bytes)", len(s))
}

// checkLen reports a name or value longer than max bytes.
func (p *parser) checkLen(f field, path, s string, max int) bool {
	if len(s) <= max {
		return true
	}
	p.errorf(f.val.Line, path, "too long: %d bytes (at most %d): %s", len(s), max, quote(s))
	return false
}

// checkMetadata reports the first mapping under n (aliases followed) with
// more than MaxMetadataKeys keys. checkTree has bounded the nodes reached.
func (p *parser) checkMetadata(n *yaml.Node, path string) bool {
	n = resolve(n)
	if n == nil {
		return true
	}
	if n.Kind == yaml.MappingNode && len(n.Content)/2 > MaxMetadataKeys {
		p.errorf(n.Line, path, "a mapping of %d keys: at most %d in one mapping of metadata", len(n.Content)/2, MaxMetadataKeys)
		return false
	}
	for _, c := range n.Content {
		if !p.checkMetadata(c, path) {
			return false
		}
	}
	return true
}
