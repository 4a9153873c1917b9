// Package jsonscan is a resumable JSON scanner that is fed a document in
// pieces and keeps only the values a Schema names: whole numbers into slots,
// booleans, bounded copies of a few strings, and the lengths of others. It
// validates the whole document (RFC 8259 grammar; string bytes are not
// checked as UTF-8) and keeps no part of it: its memory is the Scanner
// struct, whatever the document's size. The document must be an object.
package jsonscan

// Node is a value position in a Schema: what to do with a value found
// there. The zero Node is Skip.
type Node uint8

// Skip is the node of values nobody wants: they are validated, not kept.
const Skip Node = 0

// Slot names a slot, counter, flag or capture of a Def: its index plus
// one, so that the zero Slot is none and a Def literal says only what it
// wants. At makes one.
type Slot uint8

// At is the Slot of index i.
func At(i int) Slot { return Slot(i + 1) }

// None marks an unused slot in a node (the compiled form of a Def).
const None = -1

// Limits of a Scanner's fixed storage.
const (
	MaxDepth     = 64  // nesting of objects and arrays; deeper is an error
	MaxKey       = 32  // key bytes compared with a Schema's member names; longer keys match none
	MaxInts      = 24  // integer slots
	MaxBools     = 8   // boolean slots
	MaxCounters  = 8   // length counters
	MaxFlags     = 8   // presence flags
	MaxCaptures  = 4   // captured strings
	CaptureBytes = 384 // bytes of all captures together
	maxNodes     = 255
)

// Def says what a Node does with each kind of value; its zero value
// wants nothing (its values are validated and skipped). Every Slot is
// below its Max constant.
type Def struct {
	Members []Member // objects are descended with these members; nil: objects are skipped
	Elem    Node     // with Array: the node of each element
	Array   bool     // arrays are descended (else skipped)
	Int     Slot     // a whole number in [0, MaxInt] goes to this slot; any other value marks it bad (null is absent)
	Bool    Slot     // true or false goes to this slot
	Measure Slot     // a string's decoded length in bytes is added to this counter
	Capture Slot     // a string is copied to this capture, up to its size
	Raw     Slot     // an object's or array's length in bytes, as written, is added to this counter
	Flag    Slot     // any value but null sets this flag
}

// node is a Def as the scanner reads it: indexes (None: unused), and what
// the loop's fast paths need.
type node struct {
	members                                        []Member
	elem                                           Node
	array                                          bool
	intSlot, boolSlot, measure, capture, raw, flag int

	plainString bool             // a string here is only measured or skipped (write's fast path)
	index       [indexSize]uint8 // member index + 1 by keyHash
	collide     bool             // two members share a hash: member scans
}

// Member is one object member a Def wants.
type Member struct {
	Name string
	Node Node
}

// MaxInt is the largest whole number a slot takes (2^53-1, exact in a
// double, so a count survives Redis' Lua and JSON decoders in other
// languages); larger numbers mark their slot bad.
const MaxInt = 1<<53 - 1

// Schema is a set of nodes; node 1, the first added, is the document's
// root, which must be an object.
type Schema struct {
	defs     []node // index = Node; defs[0] is Skip
	capOff   [MaxCaptures]uint16
	capSize  [MaxCaptures]uint16
	capTotal int
}

// NewSchema returns a Schema holding only Skip.
func NewSchema() *Schema {
	s := &Schema{defs: []node{{}}}
	s.Set(Skip, Def{})
	return s
}

// New adds a node that wants nothing yet; Set gives it its Def. Two
// steps, so that nodes can refer to each other (and to themselves).
func (s *Schema) New() Node {
	if len(s.defs) > maxNodes {
		panic("jsonscan: too many nodes")
	}
	s.defs = append(s.defs, node{})
	n := Node(len(s.defs) - 1)
	s.Set(n, Def{})
	return n
}

// Add adds a node with its Def.
func (s *Schema) Add(d Def) Node {
	n := s.New()
	s.Set(n, d)
	return n
}

// Set gives n its Def. It panics on a slot out of range: schemas are
// built once, by this module's code.
func (s *Schema) Set(n Node, d Def) {
	index := func(v Slot, limit int) int {
		if int(v) > limit {
			panic("jsonscan: slot out of range")
		}
		return int(v) - 1
	}
	x := node{members: d.Members, elem: d.Elem, array: d.Array,
		intSlot: index(d.Int, MaxInts), boolSlot: index(d.Bool, MaxBools), measure: index(d.Measure, MaxCounters),
		capture: index(d.Capture, MaxCaptures), raw: index(d.Raw, MaxCounters), flag: index(d.Flag, MaxFlags)}
	for _, m := range d.Members {
		if m.Name == "" || len(m.Name) > MaxKey {
			panic("jsonscan: a member name must have 1 to MaxKey bytes")
		}
	}
	if len(d.Members) > 255 {
		panic("jsonscan: too many members")
	}
	if x.capture != None && s.capSize[x.capture] == 0 {
		panic("jsonscan: capture without a size (call Capture first)")
	}
	x.plainString = x.intSlot == None && x.capture == None && x.flag == None
	x.buildIndex()
	s.defs[n] = x
}

// Capture gives capture slot c its size in bytes.
func (s *Schema) Capture(c, size int) {
	if c < 0 || c >= MaxCaptures || size <= 0 || s.capSize[c] != 0 || s.capTotal+size > CaptureBytes {
		panic("jsonscan: bad capture")
	}
	s.capOff[c], s.capSize[c] = uint16(s.capTotal), uint16(size)
	s.capTotal += size
}

// keyHash picks a member's slot in Def.index: names that differ in
// length, first or last byte rarely collide.
func keyHash(key []byte) int {
	return (len(key)*7 + int(key[0]) + int(key[len(key)-1])*3) & (indexSize - 1)
}

const indexSize = 32

// member finds the node of key in d's members (Skip if none): one hash
// and one comparison, as a branch costs as much as a byte's work in Wasm.
func (d *node) member(key []byte) Node {
	if len(key) == 0 { // no member has an empty name
		return Skip
	}
	if m := d.index[keyHash(key)]; m != 0 && d.members[m-1].Name == string(key) {
		return d.members[m-1].Node
	}
	if d.collide {
		return d.scan(key)
	}
	return Skip
}

// scan finds key's member one by one.
func (d *node) scan(key []byte) Node {
	for i := range d.members {
		if d.members[i].Name == string(key) {
			return d.members[i].Node
		}
	}
	return Skip
}

// buildIndex fills d.index; colliding names are found by a scan.
func (d *node) buildIndex() {
	d.index, d.collide = [indexSize]uint8{}, false
	for i, m := range d.members {
		h := keyHash([]byte(m.Name))
		if d.index[h] != 0 {
			d.collide = true
			continue
		}
		d.index[h] = uint8(i + 1)
	}
}
