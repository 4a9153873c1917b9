package policystore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/sluicehq/sluice/controlplane/policy"
)

// TestFileRestart: versions and policies survive a restart; the seed is
// written into a new file only.
func TestFileRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policies.json")
	ctx := context.Background()
	seed, _ := policy.NewSet(mustParse(t, domainYAML("seeded", 2)))
	b1, err := NewFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s1 := newStore(t, b1, Options{Seed: seed})
	if s1.Current().Version != 1 || requestsOf(s1.Current(), "seeded") != 2 {
		t.Fatalf("new file: version %d, %+v; want the seed at version 1", s1.Current().Version, s1.Current().Policies())
	}
	if _, err := s1.Apply(ctx, "api.yaml", domainYAML("api", 5), Guard{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s1.Delete(ctx, "seeded", Guard{}); err != nil {
		t.Fatal(err)
	}
	want := s1.Current()
	s1.Close()

	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("file mode %v; want 0600", fi.Mode().Perm())
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	for _, e := range entries {
		if strings.Contains(e.Name(), ".tmp-") {
			t.Errorf("temporary file left behind: %s", e.Name())
		}
	}

	b2, err := NewFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s2 := newStore(t, b2, Options{Seed: seed})
	if !sameState(s2.Current(), want) || s2.Current().Version != 3 {
		t.Fatalf("after restart: version %d %+v; want version 3 with api only", s2.Current().Version, s2.Current().Policies())
	}
}

// TestFileDamaged: a damaged file is reported with its path and is not
// overwritten.
func TestFileDamaged(t *testing.T) {
	dir := t.TempDir()
	cases := map[string]string{
		"not JSON":       "{domain: api",
		"unknown field":  `{"format": 1, "version": 1, "policies": [], "extra": 1}`,
		"other format":   `{"format": 3, "version": 1, "policies": []}`,
		"version beyond": `{"format": 1, "version": 1, "policies": [{"domain": "a", "version": 2, "yaml": "x"}]}`,
		"domain twice":   `{"format": 1, "version": 3, "policies": [{"domain": "a", "version": 2, "yaml": "x"}, {"domain": "a", "version": 3, "yaml": "y"}]}`,
		"trailing data":  `{"format": 1, "version": 1, "policies": []} {}`,
	}
	for name, content := range cases {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(name, " ", "_")+".json")
			if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := NewFile(path)
			if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "not overwritten") {
				t.Fatalf("NewFile = %v; want an error naming %s", err, path)
			}
			got, _ := os.ReadFile(path)
			if string(got) != content {
				t.Fatal("the damaged file was changed")
			}
		})
	}
	// A file damaged after start: writes fail, the replica keeps its
	// policies.
	path := filepath.Join(dir, "later.json")
	b, err := NewFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := newStore(t, b, Options{})
	ctx := context.Background()
	if _, err := s.Apply(ctx, "api.yaml", domainYAML("api", 1), Guard{}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Apply(ctx, "api.yaml", domainYAML("api", 2), Guard{}); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("Apply on a damaged file: %v; want an error naming the file", err)
	}
	if err := s.refresh(ctx); err == nil {
		t.Fatal("refresh of a damaged file: no error")
	}
	if requestsOf(s.Current(), "api") != 1 {
		t.Fatal("the replica dropped its policies when the file was damaged")
	}
}

// TestFileSharedByTwoProcesses: two File backends on one path (as two
// processes would have) keep the version guard exact under concurrent
// writes, and each Store sees the other's writes by polling.
func TestFileSharedByTwoProcesses(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policies.json")
	var stores []*Store
	for range 2 {
		b, err := NewFile(path)
		if err != nil {
			t.Fatal(err)
		}
		stores = append(stores, newStore(t, b, Options{Logger: slog.New(slog.DiscardHandler)}))
	}
	ctx := context.Background()
	first, err := stores[0].Apply(ctx, "c.yaml", counterYAML(0), Guard{})
	if err != nil {
		t.Fatal(err)
	}
	d := waitFor(t, stores[1], convergeBound, "the other process sees the write by polling",
		func(s *Snapshot) bool { return s.Policy("counter") != nil })
	t.Logf("converged by polling in %v", d)

	const callers = 40
	var wins sync.Map
	var wg sync.WaitGroup
	var mu sync.Mutex
	conflicts := 0
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := stores[i%2].Apply(ctx, "c.yaml", counterYAML(uint64(i+1)), Expect(first.Version))
			var ce *ConflictError
			switch {
			case err == nil:
				wins.Store(i, res.Version)
			case errors.As(err, &ce):
				mu.Lock()
				conflicts++
				mu.Unlock()
			default:
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	n := 0
	wins.Range(func(_, _ any) bool { n++; return true })
	if n != 1 || conflicts != callers-1 {
		t.Fatalf("%d winners, %d conflicts; want 1 and %d", n, conflicts, callers-1)
	}
}

// TestFileVersionCache: Version reads the file again when another writer
// replaced it.
func TestFileVersionCache(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.json")
	b, err := NewFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for v := uint64(1); v <= 3; v++ {
		doc := fmt.Sprintf(`{"format": 1, "version": %d, "policies": []}`, v)
		if err := writeAtomic(path, []byte(doc)); err != nil {
			t.Fatal(err)
		}
		if got, err := b.Version(ctx); err != nil || got != v {
			t.Fatalf("Version = %d, %v; want %d", got, err, v)
		}
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if got, err := b.Version(ctx); err != nil || got != 0 {
		t.Fatalf("Version of a removed file = %d, %v; want 0", got, err)
	}
}
