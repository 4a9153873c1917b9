package main

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/version"
)

// TestVersionFlag: -version prints the stamped version, commit and Go
// version on stdout and exits 0 without starting anything, even when the
// environment holds an invalid setting.
func TestVersionFlag(t *testing.T) {
	defer func(v, c string) { version.Version, version.Commit = v, c }(version.Version, version.Commit)
	version.Version, version.Commit = "9.8.7", "abc123"
	var out, errOut bytes.Buffer
	defer func(w io.Writer) { stdout = w }(stdout)
	stdout = &out
	env := map[string]string{"SLUICE_DEADLINE": "soon"}
	code := run([]string{"-version"}, func(k string) string { return env[k] }, &errOut)
	if code != 0 {
		t.Fatalf("exit %d, stderr %s", code, errOut.String())
	}
	got := out.String()
	if !strings.HasPrefix(got, "sluice-controlplane 9.8.7 (commit abc123, go") || !strings.HasSuffix(got, ")\n") {
		t.Errorf("-version printed %q", got)
	}
}
