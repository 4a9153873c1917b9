package policy

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// limitsDoc is a domain of n descriptors with a limit each, padded with a
// comment to at least size bytes.
func limitsDoc(domain string, n, size int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "domain: %s\ndescriptors:\n", domain)
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "  - {key: k, value: v%d, rate_limit: {unit: second, requests_per_unit: 1}}\n", i)
	}
	if pad := size - b.Len() - 2; pad > 0 {
		b.WriteString("#" + strings.Repeat("x", pad) + "\n")
	}
	return b.String()
}

// writeSet writes files into a new directory: name -> content.
func writeSet(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, doc := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestSetBounds: a -policy set past a bound is refused with one error that
// names the first file past it and the bound; a set within them loads.
func TestSetBounds(t *testing.T) {
	small := func(i int) string { return limitsDoc(fmt.Sprintf("d%03d", i), 1, 0) }
	many := map[string]string{}
	for i := 0; i <= MaxDomains; i++ {
		many[fmt.Sprintf("f%03d.yaml", i)] = small(i)
	}
	big := map[string]string{}
	for i := 0; i < 5; i++ {
		big[fmt.Sprintf("f%d.yaml", i)] = limitsDoc(fmt.Sprintf("d%d", i), 1, MaxDocumentSize-10)
	}
	limits := map[string]string{}
	for i := 0; i < 4; i++ {
		limits[fmt.Sprintf("f%d.yaml", i)] = limitsDoc(fmt.Sprintf("d%d", i), 3000, 0)
	}
	cases := []struct {
		name  string
		files map[string]string
		want  string // the error's whole first line; "" loads
	}{
		{"257 domains", many, fmt.Sprintf("f%03d.yaml: too many domains: this one takes the set past %d", MaxDomains, MaxDomains)},
		{"five 1 MiB files", big, "f4.yaml: policy set too large: this file's 1048566 bytes take the set past 4194304 bytes (4 MiB"},
		{"four 1 MiB files", map[string]string{"a.yaml": big["f0.yaml"], "b.yaml": big["f1.yaml"], "c.yaml": big["f2.yaml"], "d.yaml": big["f3.yaml"]}, ""},
		{"12,000 limits in four domains", limits, `f3.yaml: domain "d3": too many limits: this domain's 3000 take the set to 12000, more than 10000`},
		{"10,001 limits in one domain", map[string]string{"a.yaml": limitsDoc("a", MaxLimits+1, 0)}, `a.yaml:10003: domain "a": descriptors[10000].rate_limit: too many limits: more than 10000`},
		{"20,001 descriptors", map[string]string{"a.yaml": "domain: a\ndescriptors:\n" + strings.Repeat("  - {key: k, descriptors: [{key: a}]}\n", 1) +
			func() string {
				var b strings.Builder
				for i := 0; i < MaxDescriptors; i++ {
					fmt.Fprintf(&b, "  - {key: k%d}\n", i)
				}
				return b.String()
			}()}, `a.yaml:20002: domain "a": descriptors[19999]: too many descriptors: more than 20000`},
		{"10,000 limits", map[string]string{"a.yaml": limitsDoc("a", 6000, 0), "b.yaml": limitsDoc("b", 4000, 0)}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := writeSet(t, c.files)
			set, err := Load(dir)
			if c.want == "" {
				if err != nil {
					t.Fatalf("refused: %.500v", err)
				}
				if set.Len() != len(c.files) {
					t.Fatalf("%d domains, want %d", set.Len(), len(c.files))
				}
				return
			}
			if err == nil {
				t.Fatalf("loaded; want %s", c.want)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, filepath.Join(dir, "")+string(filepath.Separator)) || !strings.Contains(msg, c.want) {
				t.Errorf("error %.600q\nwant it to name %q", msg, c.want)
			}
			if n := len(err.(ErrorList)); n != 1 {
				t.Errorf("%d errors; want one:\n%.1000s", n, msg)
			}
		})
	}
}
