package llm

import "github.com/sluicehq/sluice/filter/core/llm/internal/jsonscan"

// Helpers that make the schemas below read as the JSON they describe.

// object is a Def that descends into objects with these members.
func object(m ...jsonscan.Member) jsonscan.Def { return jsonscan.Def{Members: m} }

// arrayOf is a Def that descends into arrays whose elements are elem.
func arrayOf(elem jsonscan.Node) jsonscan.Def { return jsonscan.Def{Array: true, Elem: elem} }

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

// at is slot i of a Def.
func at(i int) jsonscan.Slot { return jsonscan.At(i) }
