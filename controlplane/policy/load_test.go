package policy

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// names returns the domain names of a set.
func names(s *Set) string {
	var out []string
	for _, d := range s.Domains() {
		out = append(out, d.Name)
	}
	return strings.Join(out, ",")
}

func TestLoad(t *testing.T) {
	s, err := Load("testdata/dir")
	if err != nil {
		t.Fatal(err)
	}
	if got := names(s); got != "alpha,beta,gamma" {
		t.Errorf("domains %q, want alpha,beta,gamma (hidden dirs and .txt skipped)", got)
	}
	if d := s.Domain("gamma"); d == nil || d.Source != filepath.Join("testdata", "dir", "sub", "c.yaml") {
		t.Errorf("gamma: %+v", d)
	}
	if s.Domain("nope") != nil || s.Len() != 3 {
		t.Error("lookup of an unknown domain")
	}

	// Files and directories mix; a file is read whatever its extension.
	s, err = Load("testdata/ratelimit_basic.yaml", "testdata/dir/b.yml", "example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if got := names(s); got != "beta,shop,sluice-demo" {
		t.Errorf("domains %q", got)
	}

	s, err = Load()
	if err != nil || s.Len() != 0 {
		t.Errorf("Load() = %v, %v", s, err)
	}
}

func TestLoadErrors(t *testing.T) {
	tests := []struct {
		name  string
		paths []string
		want  []string
	}{
		{"duplicate domain", []string{"testdata/dup"}, []string{
			`testdata/dup/b.yaml:2: domain "same": domain: duplicate domain (already defined in testdata/dup/a.yaml): one file per domain`}},
		{"duplicate across arguments", []string{"testdata/dir/a.yaml", "testdata/dir"}, []string{
			`testdata/dir/a.yaml:1: domain "alpha": domain: duplicate domain (already defined in testdata/dir/a.yaml): one file per domain`}},
		{"every bad file reported", []string{"testdata/bad"}, []string{
			`testdata/bad/broken.yaml:6: domain "broken": descriptors[0].rate_limit.requests_per_unit: must be > 0 (got -1)`,
			`testdata/bad/typo.yaml:4: domain "typo": descriptors[0].rate_limt: unknown field (did you mean "rate_limit"?)`}},
		{"missing path", []string{"testdata/nothing-here"}, []string{
			`testdata/nothing-here: stat: no such file or directory`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Load(tt.paths...)
			if err == nil {
				t.Fatalf("no error; loaded %q", names(s))
			}
			if s != nil {
				t.Error("a set returned with an error")
			}
			var list ErrorList
			if !errors.As(err, &list) {
				t.Fatalf("error %T", err)
			}
			if got := err.Error(); got != strings.Join(tt.want, "\n") {
				t.Errorf("got\n%s\nwant\n%s", got, strings.Join(tt.want, "\n"))
			}
		})
	}
}

func TestLoadDirectoryCases(t *testing.T) {
	dir := t.TempDir()
	// An empty directory is an error: most likely a wrong path.
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "directory holds no .yaml or .yml files") {
		t.Errorf("empty dir: %v", err)
	}
	// A Kubernetes ConfigMap volume: files are links into ..data.
	data := filepath.Join(dir, "..2026_01_01")
	if err := os.Mkdir(data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(data, "api.yaml"), []byte("domain: api\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("..2026_01_01", filepath.Join(dir, "..data")); err != nil {
		t.Skip("symlinks unsupported:", err)
	}
	if err := os.Symlink(filepath.Join("..data", "api.yaml"), filepath.Join(dir, "api.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("missing.yaml", filepath.Join(dir, "dangling.yaml")); err != nil {
		t.Fatal(err)
	}
	s, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := names(s); got != "api" {
		t.Errorf("domains %q, want api once", got)
	}
}

func TestSet(t *testing.T) {
	a, b := mustParse(t, "domain: a\n"), mustParse(t, "domain: b\n")
	s, err := NewSet(a, b)
	if err != nil {
		t.Fatal(err)
	}
	a2 := mustParse(t, "domain: a\nfailure_mode: closed\n")
	s2 := s.With(a2)
	if s.Domain("a") != a || s2.Domain("a") != a2 || s2.Domain("b") != b {
		t.Error("With changed the original or missed the new domain")
	}
	s3 := s2.Without("b")
	if s3.Domain("b") != nil || s2.Domain("b") != b || names(s3) != "a" {
		t.Error("Without")
	}
	if _, err := NewSet(a, a2); err == nil || !strings.Contains(err.Error(), `domain "a": domain: duplicate domain`) {
		t.Errorf("NewSet duplicate: %v", err)
	}
	var nilSet *Set
	if nilSet.Domain("a") != nil || nilSet.Len() != 0 || nilSet.Domains() != nil || nilSet.With(a).Domain("a") != a {
		t.Error("nil set")
	}
}
