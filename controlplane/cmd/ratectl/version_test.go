package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/version"
)

// TestVersionFlag: --version prints the stamped version, commit and Go
// version on stdout and exits 0 without a command.
func TestVersionFlag(t *testing.T) {
	defer func(v, c string) { version.Version, version.Commit = v, c }(version.Version, version.Commit)
	version.Version, version.Commit = "9.8.7", "abc123"
	for _, args := range [][]string{{"-version"}, {"--version"}, {"get", "--version"}} {
		arg := strings.Join(args, " ")
		var out, errOut bytes.Buffer
		code := run(context.Background(), args, func(string) string { return "" }, nil, &out, &errOut)
		if code != exitOK {
			t.Fatalf("%s: exit %d, stderr %s", arg, code, errOut.String())
		}
		if got := out.String(); !strings.HasPrefix(got, "ratectl 9.8.7 (commit abc123, go") {
			t.Errorf("%s printed %q", arg, got)
		}
	}
}
