package main

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/controlplane/policy"
	"github.com/sluicehq/sluice/controlplane/policystore"
)

// refusingStore applies every domain but one, which it refuses as an
// unreachable store would.
type refusingStore struct {
	refuse  string
	applied []string
}

func (s *refusingStore) Apply(_ context.Context, source string, data []byte, _ policystore.Guard) (policystore.ApplyResult, error) {
	d, err := policy.Parse(source, data)
	if err != nil {
		return policystore.ApplyResult{}, err
	}
	if d.Name == s.refuse {
		return policystore.ApplyResult{}, policystore.ErrUnavailable
	}
	s.applied = append(s.applied, d.Name)
	return policystore.ApplyResult{Domain: d.Name, Version: uint64(len(s.applied))}, nil
}

// TestReloadLogsOneLine: whatever happens, a SIGHUP logs exactly one line
// that says it; a store failure names what was and was not applied.
func TestReloadLogsOneLine(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"a", "b", "c"} {
		doc := "domain: " + d + "\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1}}]\n"
		if err := os.WriteFile(filepath.Join(dir, d+".yaml"), []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name  string
		paths []string
		store *refusingStore
		want  []string
	}{
		{"all applied", []string{dir}, &refusingStore{}, []string{`"level":"INFO"`, `"msg":"SIGHUP: applied the -policy files"`, `"changed":"a,b,c"`}},
		{"the store fails midway", []string{dir}, &refusingStore{refuse: "b"},
			[]string{`"level":"ERROR"`, `"changed":"a"`, `"not_applied":"b,c"`, "policy store unavailable"}},
		{"no files", nil, &refusingStore{}, []string{`"level":"WARN"`, "no -policy files to re-read"}},
		{"a missing file", []string{filepath.Join(dir, "nope.yaml")}, &refusingStore{},
			[]string{`"level":"ERROR"`, "refused the -policy files; the current policies stay", "nope.yaml: stat: no such file"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var buf bytes.Buffer
			reload(context.Background(), slog.New(slog.NewJSONHandler(&buf, nil)), "SIGHUP", c.paths, c.store)
			out := strings.TrimSpace(buf.String())
			if strings.Count(out, "\n") != 0 {
				t.Errorf("more than one log line:\n%s", out)
			}
			for _, w := range c.want {
				if !strings.Contains(out, w) {
					t.Errorf("log line lacks %s:\n%s", w, out)
				}
			}
		})
	}
}
