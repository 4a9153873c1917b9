package stack

import (
	"fmt"
	"os"
	"strings"
)

// Excerpt limits of an Envoy log.
const (
	excerptProblems = 10  // warning, error and critical lines kept
	excerptTail     = 20  // last lines kept
	excerptLineLen  = 600 // bytes of one line kept
)

// LogExcerpt returns what matters of an Envoy log for a failure report:
// its first warning, error and critical lines, then its last lines, with
// the start-up listing of the statically linked extensions (some 150 lines
// of it) left out and long lines cut. It says how many lines it left out.
func LogExcerpt(log string) string {
	var lines []string
	for _, l := range strings.Split(strings.TrimRight(log, "\n"), "\n") {
		if !isExtensionListing(l) {
			lines = append(lines, l)
		}
	}
	var b strings.Builder
	tailFrom := max(len(lines)-excerptTail, 0)
	problems := 0
	for _, l := range lines[:tailFrom] {
		if problems < excerptProblems && isProblem(l) {
			b.WriteString(cutLine(l) + "\n")
			problems++
		}
	}
	if left := tailFrom - problems; left > 0 {
		fmt.Fprintf(&b, "... (%d more lines; the whole log has the extension listing too)\n", left)
	}
	for _, l := range lines[tailFrom:] {
		b.WriteString(cutLine(l) + "\n")
	}
	return strings.TrimRight(b.String(), "\n")
}

// LogExcerptOf returns LogExcerpt of the file at path from byte offset from.
func LogExcerptOf(path string, from int64) string {
	b, err := os.ReadFile(path)
	if err != nil || from > int64(len(b)) {
		return "(no log)"
	}
	return LogExcerpt(string(b[from:]))
}

// LogExcerpt returns LogExcerpt of what Envoy has logged so far.
func (e *Envoy) LogExcerpt() string { return LogExcerpt(e.Log()) }

// isExtensionListing reports whether l is a line of Envoy's start-up
// listing of its extensions: "[...][info][main]   envoy.filters.http: ...",
// or the listing's heading.
func isExtensionListing(l string) bool {
	_, rest, ok := strings.Cut(l, "][info][main] ")
	return ok && (strings.HasPrefix(rest, "  ") || strings.HasPrefix(rest, "statically linked extensions:"))
}

// isProblem reports whether l is an Envoy log line at warning level or
// above.
func isProblem(l string) bool {
	return strings.Contains(l, "][warning][") || strings.Contains(l, "][error][") || strings.Contains(l, "][critical][")
}

// cutLine cuts l to excerptLineLen bytes.
func cutLine(l string) string {
	if len(l) <= excerptLineLen {
		return l
	}
	return l[:excerptLineLen] + fmt.Sprintf("... (%d bytes)", len(l))
}
