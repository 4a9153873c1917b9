package docs

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

// TestArchitectureSVG: architecture.svg is what architecture.txt draws
// (run go generate ./docs after changing the description).
func TestArchitectureSVG(t *testing.T) {
	src, err := os.ReadFile("architecture.txt")
	if err != nil {
		t.Fatal(err)
	}
	want, err := Diagram(src)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("architecture.svg")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("architecture.svg is not what architecture.txt draws: run go generate ./docs")
	}
	for _, w := range []string{">sluice-controlplane<", ">Redis<", ">ShouldRateLimit<"} {
		if !strings.Contains(string(got), w) {
			t.Errorf("the picture lacks %s", w)
		}
	}
}

// TestDiagramErrors: a bad description is refused with its line.
func TestDiagramErrors(t *testing.T) {
	for _, tc := range []struct{ src, want string }{
		{"box a 0 0 nolabel", "line 1: want a quoted text"},
		{"box a x 0 \"A\"", "line 1: column and row"},
		{"box a 0 0 \"A\"\nbox a 1 0 \"B\"", "line 2: box a twice"},
		{"box a 0 0 \"A\"\narrow a b \"x\"", "arrow a -> b: no such box"},
		{"circle a 0 0 \"A\"", "line 1: want box"},
	} {
		if _, err := Diagram([]byte(tc.src)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.src, err, tc.want)
		}
	}
}
