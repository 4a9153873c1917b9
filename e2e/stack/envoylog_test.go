package stack

import (
	"fmt"
	"strings"
	"testing"
)

// TestLogExcerpt: a failure shows Envoy's warnings and errors and its last
// lines, not the 150-line listing of its extensions that starts every log.
func TestLogExcerpt(t *testing.T) {
	var b strings.Builder
	line := func(level, msg string) { fmt.Fprintf(&b, "[2026-11-26 00:14:25.885][%s][main] %s\n", level, msg) }
	line("info", "initializing epoch 0 (base id=0, hot restart version=disabled)")
	line("info", "statically linked extensions:")
	for i := 0; i < 150; i++ {
		line("info", fmt.Sprintf("  envoy.ext%d: envoy.a, envoy.b, %s", i, strings.Repeat("envoy.x, ", 100)))
	}
	line("info", "loading 1 listener(s)")
	line("warning", "There is no configured limit to the number of allowed active downstream connections.")
	line("critical", "error initializing config: "+strings.Repeat("y", 5000))
	for i := 0; i < 40; i++ {
		line("info", fmt.Sprintf("line %d", i))
	}
	got := LogExcerpt(b.String())
	lines := strings.Split(got, "\n")
	if len(lines) > excerptProblems+excerptTail+1 {
		t.Errorf("%d lines, want at most %d:\n%s", len(lines), excerptProblems+excerptTail+1, got)
	}
	if len(got) > 8000 {
		t.Errorf("%d bytes, want a few KB", len(got))
	}
	for _, want := range []string{"][warning][main] There is no configured limit", "][critical][main] error initializing config: yyy",
		"more lines", "line 20", "line 39"} {
		if !strings.Contains(got, want) {
			t.Errorf("excerpt lacks %q:\n%s", want, got)
		}
	}
	for _, unwanted := range []string{"envoy.ext", "line 19\n"} {
		if strings.Contains(got, unwanted) {
			t.Errorf("excerpt has %q:\n%s", unwanted, got)
		}
	}
}
