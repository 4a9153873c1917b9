package algorithms

import (
	"go/parser"
	"go/token"
	"os"
	"strings"
	"testing"
)

// TestImportsNothing: the package imports no other package, not even the
// standard library's, so that filter.wasm, which runs it, pays for nothing
// more (package time, say, brings syscall and its WASI imports).
func TestImportsNothing(t *testing.T) {
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			t.Errorf("%s imports %s", name, imp.Path.Value)
		}
	}
}
