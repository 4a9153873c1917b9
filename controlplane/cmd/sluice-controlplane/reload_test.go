package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/controlplane/internal/policystore"
	"github.com/sluicehq/sluice/controlplane/policy"
	"github.com/sluicehq/sluice/internal/redistest"
)

// refusingStore applies every domain but one, which it refuses as an
// unreachable store would.
type refusingStore struct {
	refuse  string
	applied []string
}

// PutFiles puts every source in force, unless one names the refused domain.
func (s *refusingStore) PutFiles(_ context.Context, srcs []policystore.Source) ([]policystore.SourceResult, error) {
	var res []policystore.SourceResult
	for _, src := range srcs {
		r := policystore.SourceResult{Path: src.Path, Outcome: policystore.InForce}
		for _, f := range src.Files {
			if f.Domain.Name == s.refuse {
				return nil, policystore.ErrUnavailable
			}
			r.Changed = append(r.Changed, f.Domain.Name)
		}
		res = append(res, r)
	}
	return res, nil
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
		name     string
		paths    []string
		seedOnly bool
		store    *refusingStore
		want     []string
	}{
		{"in force", []string{dir}, false, &refusingStore{}, []string{`"level":"INFO"`, `"msg":"SIGHUP: the policy files are in force"`, `"changed":"a,b,c"`}},
		{"the store fails", []string{dir}, false, &refusingStore{refuse: "b"},
			[]string{`"level":"ERROR"`, "the policy store refused the -policy files; the policies in force stay", "policy store unavailable"}},
		{"seed only: all applied", []string{dir}, true, &refusingStore{}, []string{`"level":"INFO"`, `"msg":"SIGHUP: applied the -policy files"`, `"changed":"a,b,c"`}},
		{"seed only: the store fails midway", []string{dir}, true, &refusingStore{refuse: "b"},
			[]string{`"level":"ERROR"`, `"changed":"a"`, `"not_applied":"b,c"`, "policy store unavailable"}},
		{"no files", nil, false, &refusingStore{}, []string{`"level":"WARN"`, "no -policy files to re-read"}},
		{"a missing file", []string{filepath.Join(dir, "nope.yaml")}, false, &refusingStore{},
			[]string{`"level":"ERROR"`, "refused the -policy files; the policies in force stay", "nope.yaml: stat: no such file"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var buf bytes.Buffer
			reload(context.Background(), slog.New(slog.NewJSONHandler(&buf, nil)), "SIGHUP", policyFiles{c.paths, c.seedOnly}, c.store, time.Now())
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

// TestReloadUnchangedAfterStart: the first SIGHUP after start, with the
// -policy files as they were, changes nothing on either store, whether the
// files own their domains or only seed: every domain is logged unchanged
// and no version moves. (The store used to be seeded with the domains
// re-encoded as canonical YAML, which the files' text never matched, so
// that SIGHUP rewrote every domain.)
func TestReloadUnchangedAfterStart(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"a", "b", "c"} {
		doc := "# the " + d + " team's limits\ndomain: " + d + "\ndescriptors:\n  - key: k   # per key\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
		if err := os.WriteFile(filepath.Join(dir, d+".yaml"), []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	backends := map[string]func(t *testing.T) policystore.Backend{
		"file": func(t *testing.T) policystore.Backend {
			b, err := policystore.NewFile(filepath.Join(t.TempDir(), "policies.json"))
			if err != nil {
				t.Fatal(err)
			}
			return b
		},
		"redis": func(t *testing.T) policystore.Backend {
			c := redis.NewClient(&redis.Options{Addr: redistest.StartServer(t).Addr()})
			t.Cleanup(func() { c.Close() })
			b, err := policystore.NewRedis(c, policystore.RedisOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return b
		},
	}
	for name, newBackend := range backends {
		for _, seedOnly := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/seed only %v", name, seedOnly), func(t *testing.T) {
				testReloadUnchanged(t, newBackend(t), dir, seedOnly)
			})
		}
	}
}

func testReloadUnchanged(t *testing.T, b policystore.Backend, dir string, seedOnly bool) {
	ctx := context.Background()
	seed, files, err := readPolicies([]string{dir}, seedOnly)
	if err != nil {
		t.Fatal(err)
	}
	st, err := policystore.New(ctx, b, policystore.Options{Seed: seed, Files: files, PollInterval: time.Hour,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	before := st.Current()
	var buf bytes.Buffer
	reload(ctx, slog.New(slog.NewJSONHandler(&buf, nil)), "SIGHUP", policyFiles{[]string{dir}, seedOnly}, st, time.Now())
	out := strings.TrimSpace(buf.String())
	msg := `"msg":"SIGHUP: the policy files are in force"`
	if seedOnly {
		msg = `"msg":"SIGHUP: applied the -policy files"`
	}
	for _, w := range []string{msg, `"changed":""`, `"unchanged":"a,b,c"`} {
		if !strings.Contains(out, w) {
			t.Errorf("log line lacks %s:\n%s", w, out)
		}
	}
	v, err := st.Backend().Version(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after := st.Current(); v != before.Version || after.Version != before.Version {
		t.Errorf("store version %d, snapshot %d after the SIGHUP; want %d (nothing written)", v, after.Version, before.Version)
	}
	for _, p := range before.Policies() {
		if now := st.Current().Policy(p.Domain); now == nil || now.Version != p.Version {
			t.Errorf("domain %s: changed by the SIGHUP (was version %d)", p.Domain, p.Version)
		}
	}
}
