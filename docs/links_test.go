package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	mdLink  = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	imgSrc  = regexp.MustCompile(`<img[^>]*\ssrc="([^"]+)"`)
	heading = regexp.MustCompile(`(?m)^#{1,6}\s+(.*)$`)
)

// anchor is GitHub's id for a heading: lower case, punctuation dropped,
// spaces to hyphens.
func anchor(h string) string {
	h = strings.ToLower(strings.TrimSpace(h))
	var b strings.Builder
	for _, r := range h {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors returns the heading ids of a markdown file.
func anchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	inCode := false
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "```") {
			inCode = !inCode
		}
		if m := heading.FindStringSubmatch(l); m != nil && !inCode {
			out[anchor(m[1])] = true
		}
	}
	return out
}

// TestLinks: every relative link in README.md and docs/ names a file (or
// directory) that exists, and its #fragment a heading of that page.
func TestLinks(t *testing.T) {
	n := 0
	for _, page := range pages(t) {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		text := regexp.MustCompile("(?s)```.*?```").ReplaceAllString(string(b), "")
		text = regexp.MustCompile("`[^`\n]*`").ReplaceAllString(text, "")
		var targets []string
		for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
			targets = append(targets, m[1])
		}
		for _, m := range imgSrc.FindAllStringSubmatch(text, -1) {
			targets = append(targets, m[1])
		}
		for _, target := range targets {
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			n++
			file, frag, _ := strings.Cut(target, "#")
			path := page
			if file != "" {
				path = filepath.Join(filepath.Dir(page), file)
				if _, err := os.Stat(path); err != nil {
					t.Errorf("%s: link %q: %v", page, target, err)
					continue
				}
			}
			if frag != "" && strings.HasSuffix(path, ".md") && !anchors(t, path)[frag] {
				t.Errorf("%s: link %q: %s has no heading #%s", page, target, path, frag)
			}
		}
	}
	if n < 10 {
		t.Fatalf("only %d relative links found: the test no longer sees them", n)
	}
}
