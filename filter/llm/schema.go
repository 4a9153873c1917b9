package llm

import "github.com/sluicehq/sluice/filter/llm/internal/jsonscan"

// Helpers that make the schemas below read as the JSON they describe.

// object is a Def that descends into objects with these members.
func object(m ...jsonscan.Member) jsonscan.Def {
	d := jsonscan.NoDef()
	d.Members = m
	return d
}

// arrayOf is a Def that descends into arrays whose elements are elem.
func arrayOf(elem jsonscan.Node) jsonscan.Def {
	d := jsonscan.NoDef()
	d.Array, d.Elem = true, elem
	return d
}

// member is one member of an object Def.
func member(name string, n jsonscan.Node) jsonscan.Member {
	return jsonscan.Member{Name: name, Node: n}
}

// members gives several names the same node.
func members(n jsonscan.Node, names ...string) []jsonscan.Member {
	m := make([]jsonscan.Member, len(names))
	for i, name := range names {
		m[i] = member(name, n)
	}
	return m
}

// intAt is a Def that reads a whole number into slot.
func intAt(slot int) jsonscan.Def {
	d := jsonscan.NoDef()
	d.Int = slot
	return d
}

// boolAt is a Def that reads a boolean into slot.
func boolAt(slot int) jsonscan.Def {
	d := jsonscan.NoDef()
	d.Bool = slot
	return d
}

// measured is a Def that counts a string's decoded bytes in counter c.
func measured(c int) jsonscan.Def {
	d := jsonscan.NoDef()
	d.Measure = c
	return d
}

// captured is a Def that copies a string into capture c.
func captured(c int) jsonscan.Def {
	d := jsonscan.NoDef()
	d.Capture = c
	return d
}

// flagged is a Def that sets flag f on any value but null.
func flagged(f int) jsonscan.Def {
	d := jsonscan.NoDef()
	d.Flag = f
	return d
}
