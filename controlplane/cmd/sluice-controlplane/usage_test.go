package main

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"os"
	"strings"
	"testing"
)

// TestFlagGroups: every flag is in exactly one group of -h.
func TestFlagGroups(t *testing.T) {
	fs, _ := newFlagSet(&config{})
	in := map[string]string{}
	for _, g := range flagGroups {
		for _, name := range g.flags {
			if prev, ok := in[name]; ok {
				t.Errorf("-%s is in the groups %q and %q", name, prev, g.name)
			}
			in[name] = g.name
		}
	}
	fs.VisitAll(func(f *flag.Flag) {
		if _, ok := in[f.Name]; !ok {
			t.Errorf("-%s is in no group of flagGroups (usage.go): add it where -h should list it", f.Name)
		}
	})
}

// TestUsage: -h starts with what the program is and an example, then the
// flags by group; a bad flag is one line with a hint, not the usage.
func TestUsage(t *testing.T) {
	var out bytes.Buffer
	if _, err := parseFlags([]string{"-h"}, func(string) string { return "" }, &out); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	lines := strings.Split(out.String(), "\n")
	if lines[0] != summary || !strings.Contains(out.String(), "Example:\n  sluice-controlplane -redis-addrs") {
		t.Fatalf("-h starts:\n%s", strings.Join(lines[:8], "\n"))
	}
	for _, g := range []string{"\nGeneral:\n", "\nRedis:\n", "\nPolicies:\n", "\nConnection bounds:\n"} {
		if !strings.Contains(out.String(), g) {
			t.Errorf("-h has no group %q", strings.TrimSpace(g))
		}
	}
	if strings.Contains(out.String(), "\nOther:\n") {
		t.Errorf("-h lists flags under Other: put them in flagGroups")
	}

	for _, tc := range []struct{ arg, want string }{
		{"-grpc-adr", "unknown flag -grpc-adr: did you mean -grpc-addr? (sluice-controlplane -h lists the flags)"},
		{"-zzzzzzzz", "unknown flag -zzzzzzzz (sluice-controlplane -h lists the flags)"},
	} {
		var out bytes.Buffer
		_, err := parseFlags([]string{tc.arg}, func(string) string { return "" }, &out)
		if err == nil || err.Error() != tc.want || out.Len() != 0 {
			t.Errorf("%s: error %v, printed %q; want only the error %q", tc.arg, err, out.String(), tc.want)
		}
	}
	var stderr bytes.Buffer
	if code := run([]string{"-deadlin", "1s"}, func(string) string { return "" }, &stderr); code != 2 ||
		strings.Count(stderr.String(), "\n") != 1 || !strings.Contains(stderr.String(), "did you mean -deadline?") {
		t.Errorf("run -deadlin: status %d, printed %q; want status 2 and one line", code, stderr.String())
	}
}

// TestLogFormatAuto: text on a terminal, JSON into a pipe or file.
func TestLogFormatAuto(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "log")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, w := range []io.Writer{f, &bytes.Buffer{}} {
		log, err := newLogger(&config{logLevel: "info", logFormat: "auto"}, w)
		if err != nil {
			t.Fatal(err)
		}
		log.Info("hello")
	}
	b, _ := os.ReadFile(f.Name())
	if !strings.HasPrefix(string(b), `{"time"`) {
		t.Errorf("auto into a file wrote %q, want JSON", b)
	}
	if tty, err := os.OpenFile("/dev/tty", os.O_WRONLY, 0); err == nil {
		defer tty.Close()
		if !isTerminal(tty) {
			t.Errorf("/dev/tty is not taken for a terminal")
		}
	}
	if isTerminal(f) {
		t.Errorf("a file is taken for a terminal")
	}
}

// TestFlagsDocumented: every flag has a row in docs/controlplane.md, with
// its environment variable, under its group's heading.
func TestFlagsDocumented(t *testing.T) {
	b, err := os.ReadFile("../../../docs/controlplane.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	group := map[string]string{}
	for _, g := range flagGroups {
		for _, n := range g.flags {
			group[n] = g.name
		}
	}
	fs, envOf := newFlagSet(&config{})
	fs.VisitAll(func(f *flag.Flag) {
		row := ""
		for _, l := range strings.Split(doc, "\n") {
			if strings.HasPrefix(l, "| `-"+f.Name+"` |") {
				row = l
				break
			}
		}
		switch {
		case row == "":
			t.Errorf("-%s has no row in docs/controlplane.md (| `-%s` | `%s` | default | meaning |)", f.Name, f.Name, envOf[f.Name])
		case envOf[f.Name] != "" && !strings.Contains(row, "`"+envOf[f.Name]+"`"):
			t.Errorf("the row of -%s in docs/controlplane.md lacks its variable %s", f.Name, envOf[f.Name])
		default:
			head := "\n### " + group[f.Name] + "\n"
			i, j := strings.Index(doc, head), strings.Index(doc, row)
			if i < 0 || j < i || strings.Contains(doc[i+len(head):j], "\n### ") {
				t.Errorf("-%s is documented outside its group %q", f.Name, group[f.Name])
			}
		}
	})
	for _, e := range envOnly {
		if !strings.Contains(doc, "`"+e[0]+"`") {
			t.Errorf("$%s is not in docs/controlplane.md", e[0])
		}
	}
}
