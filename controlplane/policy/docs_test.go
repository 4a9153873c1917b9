package policy

import (
	"os"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/algorithms"
)

// TestFieldsDocumented: every field the parser accepts has a row in the
// table of its object in docs/policy.md.
func TestFieldsDocumented(t *testing.T) {
	b, err := os.ReadFile("../../docs/policy.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	for _, tbl := range []struct {
		heading string
		fields  []string
	}{
		{"## Domain fields", domainFields},
		{"## Descriptor fields", descriptorFields},
		{"## Limit fields", limitFields},
		{"`replaces` entries take", replacesFields},
	} {
		i := strings.Index(doc, tbl.heading)
		if i < 0 {
			t.Errorf("docs/policy.md has no %q", tbl.heading)
			continue
		}
		section := doc[i:]
		if j := strings.Index(section[len(tbl.heading):], "\n## "); j >= 0 {
			section = section[:len(tbl.heading)+j]
		}
		if j := strings.Index(section, "\n\n|"); j >= 0 { // the first table after the heading
			section = section[j+2:]
			if k := strings.Index(section, "\n\n"); k >= 0 {
				section = section[:k]
			}
		}
		for _, f := range tbl.fields {
			if !strings.Contains(section, "\n| `"+f+"` |") && !strings.HasPrefix(section, "| `"+f+"` |") {
				t.Errorf("docs/policy.md: %q lists no row | `%s` | type | default | ... |", tbl.heading, f)
			}
		}
	}
	for _, a := range algorithms.Kinds() {
		if !strings.Contains(doc, "\n| `"+a.String()+"` |") {
			t.Errorf("docs/policy.md: the algorithms table has no row for %s", a)
		}
	}
}
