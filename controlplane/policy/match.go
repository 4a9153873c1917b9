package policy

import "strings"

// level is one level of the match index: the descriptors of one list.
type level struct {
	exact map[Entry]*node  // key and exact value
	wild  []wildcard       // key and value pattern, in file order
	byKey map[string]*node // key only (no value)
}

// wildcard is a descriptor whose value has a "*" in it.
type wildcard struct {
	key   string
	parts []string // the value split at each "*": parts[0] the prefix, the last the suffix
	node  *node
}

// match reports whether value matches the pattern of parts, each "*" (a
// boundary between parts) matching any run of characters, as
// envoyproxy/ratelimit's wildcardMatch: the value starts with the first
// part and ends with the last, and holds the others in order, without
// overlap, between them. The leftmost occurrence of each middle part is
// taken, which finds a match whenever there is one. It allocates nothing.
func match(parts []string, value string) bool {
	first, last := parts[0], parts[len(parts)-1]
	if len(value) < len(first)+len(last) || !strings.HasPrefix(value, first) || !strings.HasSuffix(value, last) {
		return false
	}
	rest := value[len(first) : len(value)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return true
}

// node is one descriptor in the index.
type node struct {
	limits []*Limit
	next   *level // nil when the descriptor has no children
}

// build indexes the descriptors for Match and numbers the replaced names for
// DropReplaced.
func (d *Domain) build() {
	d.root = buildLevel(d.Descriptors)
	setShared(d.Descriptors, nil)
	bits := map[string]int{}
	for _, l := range d.limits {
		for _, r := range l.Replaces {
			if _, ok := bits[r]; !ok {
				bits[r] = len(bits)
			}
		}
	}
	d.replaceable = len(bits)
	for _, l := range d.limits {
		l.replacedBit = -1
		if b, ok := bits[l.Name]; ok && l.Name != "" {
			l.replacedBit = b
		}
		l.replaceBits = nil
		for _, r := range l.Replaces {
			l.replaceBits = append(l.replaceBits, bits[r])
		}
	}
}

// setShared sets the SharedValues of the limits under ds, whose ancestors'
// shared values are above (one per level; "" where not shared).
func setShared(ds []*Descriptor, above []string) {
	for _, d := range ds {
		shared := ""
		if d.ShareThreshold {
			shared = d.Value
		}
		path := append(above[:len(above):len(above)], shared)
		any := false
		for _, v := range path {
			any = any || v != ""
		}
		for _, l := range d.Limits {
			l.SharedValues = nil
			if any {
				l.SharedValues = path
			}
		}
		setShared(d.Descriptors, path)
	}
}

// buildLevel indexes one descriptor list, recursively.
func buildLevel(ds []*Descriptor) *level {
	if len(ds) == 0 {
		return nil
	}
	lv := &level{}
	for _, d := range ds {
		n := &node{limits: d.Limits, next: buildLevel(d.Descriptors)}
		switch {
		case d.Value == "":
			if lv.byKey == nil {
				lv.byKey = map[string]*node{}
			}
			lv.byKey[d.Key] = n
		case strings.Contains(d.Value, "*"):
			lv.wild = append(lv.wild, wildcard{key: d.Key, parts: strings.Split(d.Value, "*"), node: n})
		default:
			if lv.exact == nil {
				lv.exact = map[Entry]*node{}
			}
			lv.exact[Entry{d.Key, d.Value}] = n
		}
	}
	return lv
}

// find returns the descriptor of lv that entry e selects: the exact key and
// value first, then the first wildcard (in file order) whose key is e's and
// whose pattern matches e's value (see match), then the descriptor with e's
// key and no value.
func (lv *level) find(e Entry) *node {
	if n := lv.exact[e]; n != nil {
		return n
	}
	for i := range lv.wild {
		w := &lv.wild[i]
		if w.key == e.Key && match(w.parts, e.Value) {
			return w.node
		}
	}
	return lv.byKey[e.Key]
}

// Match returns the limits that apply to one request descriptor (its entries
// in order), following envoyproxy/ratelimit: each entry selects a descriptor
// at the next level (exact value, else the first matching wildcard, else the
// key-only descriptor, with no backtracking), and the limits are those of the
// descriptor the last entry selects. A descriptor deeper or shallower than
// the request, or an entry that selects nothing, yields no limits. sluice
// returns every limit of that descriptor (rate_limits: all must pass).
//
// The result is shared and must not be modified; it is nil when nothing
// matches. It may hold an Unlimited limit (answer OK without counting).
// Apply DropReplaced across the request's descriptors before counting.
// Match allocates nothing.
func (d *Domain) Match(entries []Entry) []*Limit {
	if d == nil || len(entries) == 0 {
		return nil
	}
	lv := d.root
	for i, e := range entries {
		if lv == nil {
			return nil
		}
		n := lv.find(e)
		if n == nil {
			return nil
		}
		if i == len(entries)-1 {
			return n.limits
		}
		lv = n.next
	}
	return nil
}

// DropReplaced applies envoyproxy/ratelimit's replaces across one request.
// matched[i] is what Match returned for the request's descriptor i. Every
// limit matched anywhere in the request (unlimited ones included) contributes
// the names it replaces; then every limit whose name was replaced is dropped.
// A descriptor left with no limits is nil (OK, nothing counted).
//
// DropReplaced updates matched in place and returns it. The inner slices are
// never modified: one that loses a limit is replaced by a new slice. When the
// domain has no replaces at all it returns at once and allocates nothing.
func (d *Domain) DropReplaced(matched [][]*Limit) [][]*Limit {
	if d == nil || d.replaceable == 0 {
		return matched
	}
	var small [4]uint64
	set := small[:]
	if words := (d.replaceable + 63) / 64; words > len(small) {
		set = make([]uint64, words)
	}
	hit := false
	for _, ls := range matched {
		for _, l := range ls {
			for _, b := range l.replaceBits {
				set[b/64] |= 1 << (b % 64)
				hit = true
			}
		}
	}
	if !hit {
		return matched
	}
	replaced := func(l *Limit) bool {
		return l.replacedBit >= 0 && set[l.replacedBit/64]&(1<<(l.replacedBit%64)) != 0
	}
	for i, ls := range matched {
		drop := 0
		for _, l := range ls {
			if replaced(l) {
				drop++
			}
		}
		if drop == 0 {
			continue
		}
		if drop == len(ls) {
			matched[i] = nil
			continue
		}
		kept := make([]*Limit, 0, len(ls)-drop)
		for _, l := range ls {
			if !replaced(l) {
				kept = append(kept, l)
			}
		}
		matched[i] = kept
	}
	return matched
}
