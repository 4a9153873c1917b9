// Package jsontest holds what the tests of filter/core/llm and its scanner ask
// of encoding/json: whether a document is one the scanner must accept.
package jsontest

import (
	"bytes"
	"encoding/json"
)

// ValidObject reports whether doc is valid JSON whose value is an object
// nested at most maxDepth deep: what the scanner accepts.
func ValidObject(doc []byte, maxDepth int) bool {
	return json.Valid(doc) && bytes.HasPrefix(bytes.TrimLeft(doc, " \t\r\n"), []byte("{")) && Depth(doc) <= maxDepth
}

// Depth is the deepest nesting of objects and arrays in a valid doc.
func Depth(doc []byte) int {
	d := json.NewDecoder(bytes.NewReader(doc))
	n, deepest := 0, 0
	for {
		tok, err := d.Token()
		if err != nil {
			return deepest
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			n++
			deepest = max(deepest, n)
		case json.Delim('}'), json.Delim(']'):
			n--
		}
	}
}
