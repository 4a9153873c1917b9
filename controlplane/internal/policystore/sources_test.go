package policystore

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
)

// src is a SourceState of path at stamp whose files hold domain=yaml pairs;
// its hash is the concatenation, so that equal files hash alike.
func src(path string, stamp int64, pairs ...string) SourceState {
	s := SourceState{SourceRecord: SourceRecord{Path: path, Stamp: stamp}}
	for i := 0; i < len(pairs); i += 2 {
		s.Records = append(s.Records, Record{Domain: pairs[i], YAML: []byte(pairs[i+1]), Owner: path + "/" + pairs[i] + ".yaml"})
		s.Hash += pairs[i] + "=" + pairs[i+1] + ";"
	}
	return s
}

// testSources runs the rule of SourceState on b, a new empty store, and
// checks each step against applySources, the rule in Go.
func testSources(t *testing.T, b Backend) {
	ctx := context.Background()
	if _, _, err := b.PutSources(ctx, []SourceState{src("/p", 1, "a", "a1")}); !errors.Is(err, ErrUninitialized) {
		t.Fatalf("PutSources before Init: %v; want ErrUninitialized", err)
	}
	if _, err := b.Init(ctx, State{Version: 1}); err != nil {
		t.Fatal(err)
	}
	model := State{Version: 1}
	type want struct {
		outcome                           Outcome
		changed, unchanged, deleted, kept string // comma-joined
	}
	steps := []struct {
		name string
		srcs []SourceState
		want []want
	}{
		{"first files", []SourceState{src("/p", 10, "a", "a1", "b", "b1")}, []want{{InForce, "a,b", "", "", ""}}},
		{"the same again", []SourceState{src("/p", 10, "a", "a1", "b", "b1")}, []want{{InForce, "", "a,b", "", ""}}},
		{"older files", []SourceState{src("/p", 5, "a", "a0")}, []want{{outcome: Older}}},
		{"newer files drop b", []SourceState{src("/p", 20, "a", "a2")}, []want{{InForce, "a", "", "b", ""}}},
		{"same files, older stamp", []SourceState{src("/p", 2, "a", "a2")}, []want{{InForce, "", "a", "", ""}}},
		{"another path, older", []SourceState{src("/q", 15, "a", "qa", "c", "c1")}, []want{{InForce, "c", "", "", "a"}}},
		{"another path, newer", []SourceState{src("/q", 25, "a", "qa", "c", "c1")}, []want{{InForce, "a", "c", "", ""}}},
		{"the first path again leaves a to /q", []SourceState{src("/p", 30, "d", "d1")}, []want{{InForce, "d", "", "", ""}}},
		{"two paths at once", []SourceState{src("/p", 31, "d", "d2"), src("/q", 26, "c", "c1")},
			[]want{{InForce, "d", "", "", ""}, {InForce, "", "c", "a", ""}}},
	}
	for _, s := range steps {
		res, v, err := b.PutSources(ctx, s.srcs)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		var modelRes []SourceResult
		var changed bool
		model, modelRes, changed, _ = applySources(model, s.srcs)
		if (v != 0) != changed || (changed && v != model.Version) {
			t.Errorf("%s: store version %d; the rule says %d (changed %v)", s.name, v, model.Version, changed)
		}
		for i, w := range s.want {
			r := res[i]
			got := want{r.Outcome, strings.Join(r.Changed, ","), strings.Join(r.Unchanged, ","), strings.Join(r.Deleted, ","), strings.Join(r.Kept, ",")}
			if got != w {
				t.Errorf("%s: source %s: %+v; want %+v", s.name, r.Path, got, w)
			}
			if !reflect.DeepEqual(r, modelRes[i]) {
				t.Errorf("%s: %+v; the rule in Go says %+v", s.name, r, modelRes[i])
			}
		}
		st, err := b.Load(ctx)
		if err != nil || !reflect.DeepEqual(st, model) {
			t.Fatalf("%s: Load = %+v, %v\nthe rule in Go says %+v", s.name, st, err, model)
		}
	}
	if r := model.Sources; len(r) != 2 || r[0].Stamp != 31 || r[1].Stamp != 26 {
		t.Errorf("source records %+v; want /p at 31 and /q at 26", r)
	}

	// A domain a file owns refuses Put and Delete, and changes nothing,
	// unless taken over; the next files put in force take it back.
	var owned *OwnedError
	if _, _, err := b.Put(ctx, "c", []byte("x"), Guard{}); !errors.As(err, &owned) || !strings.Contains(err.Error(), "/q/c.yaml") {
		t.Fatalf("Put of a file's domain: %v; want an OwnedError naming /q/c.yaml", err)
	}
	if _, err := b.Delete(ctx, "d", Expect(0)); !errors.As(err, &owned) || !strings.Contains(err.Error(), "/p/d.yaml") {
		t.Fatalf("Delete of a file's domain: %v; want an OwnedError naming /p/d.yaml", err)
	}
	if st, _ := b.Load(ctx); !reflect.DeepEqual(st, model) {
		t.Fatalf("a refused change changed the store: %+v", st)
	}
	v, unchanged, err := b.Put(ctx, "c", []byte("c1"), Guard{TakeOver: true})
	if err != nil || unchanged {
		t.Fatalf("Put taking over: %d, %v, %v; want written", v, unchanged, err)
	}
	if st, _ := b.Load(ctx); st.Records[0].Domain != "c" || st.Records[0].Owner != "" || st.Records[0].Source != "" {
		t.Fatalf("after a take-over: %+v; want c the store's", st.Records[0])
	}
	res, _, err := b.PutSources(ctx, []SourceState{src("/q", 26, "c", "c1")})
	if err != nil || strings.Join(res[0].Changed, ",") != "c" {
		t.Fatalf("the files again after a take-over: %+v, %v; want c changed (taken back)", res, err)
	}
	if _, err := b.Delete(ctx, "d", Guard{TakeOver: true}); err != nil {
		t.Fatalf("Delete taking over: %v", err)
	}
	if st, _ := b.Load(ctx); len(st.Records) != 1 || st.Records[0].Owner != "/q/c.yaml" || !reflect.DeepEqual(st.Sources, model.Sources) {
		t.Fatalf("at the end: %+v", st)
	}
}

func TestFileSources(t *testing.T) {
	b, err := NewFile(filepath.Join(t.TempDir(), "p.json"))
	if err != nil {
		t.Fatal(err)
	}
	testSources(t, b)
}

func TestRedisSources(t *testing.T) {
	testSources(t, newRedisBackend(t, redistest.StartServer(t).Addr()))
}

func TestRedisClusterSources(t *testing.T) {
	testSources(t, newRedisBackend(t, redistest.StartCluster(t, 3).Addrs()...))
}

// TestInitKeepsOwners: a state written back into a lost store keeps who
// owns each domain and the versions of the sources.
func TestInitKeepsOwners(t *testing.T) {
	ctx := context.Background()
	st := State{Version: 4, Records: []Record{
		{Domain: "a", Version: 3, YAML: []byte("a1"), Owner: "/p/a.yaml", Source: "/p"},
		{Domain: "b", Version: 4, YAML: []byte("b1")},
	}, Sources: []SourceRecord{{Path: "/p", Stamp: 7, Hash: "h"}}}
	for name, b := range map[string]Backend{"redis": newRedisBackend(t, redistest.StartServer(t).Addr()), "file": mustFile(t)} {
		if ok, err := b.Init(ctx, st); err != nil || !ok {
			t.Fatalf("%s: Init = %v, %v", name, ok, err)
		}
		if got, err := b.Load(ctx); err != nil || !reflect.DeepEqual(got, st) {
			t.Fatalf("%s: Load = %+v, %v\nwant %+v", name, got, err, st)
		}
	}
}

// mustFile returns a File backend in a temporary directory.
func mustFile(t *testing.T) *File {
	t.Helper()
	b, err := NewFile(filepath.Join(t.TempDir(), "p.json"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// writeSource writes policy files into dir (created), domain=requests
// pairs, and returns the dir's sources as ReadSources reads them.
func writeSource(t *testing.T, dir string, limits map[string]int) []Source {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for d, n := range limits {
		if err := os.WriteFile(filepath.Join(dir, d+".yaml"), domainYAML(d, n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	srcs, err := ReadSources(dir)
	if err != nil {
		t.Fatal(err)
	}
	return srcs
}

// TestFilesOwnTheirDomains: a Store started with policy files puts them in
// force over what the store held, ratectl's Apply and Delete of their
// domains are refused, the other domains stay the store's, and a replica
// with older files changes nothing.
func TestFilesOwnTheirDomains(t *testing.T) {
	srv := redistest.StartServer(t)
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "policies")
	firstFiles := writeSource(t, dir, map[string]int{"api": 10})
	a := newStore(t, newRedisBackend(t, srv.Addr()), Options{Files: firstFiles})
	if _, err := a.Apply(ctx, "web.yaml", domainYAML("web", 5), Guard{}); err != nil {
		t.Fatal(err)
	}
	if p := a.Current().Policy("api"); p == nil || p.Owner != filepath.Join(dir, "api.yaml") || p.Source != dir {
		t.Fatalf("api after start: %+v; want owned by its file", p)
	}
	_, err := a.Apply(ctx, "ratectl", domainYAML("api", 1), Guard{})
	var owned *OwnedError
	if !errors.As(err, &owned) || !strings.Contains(err.Error(), filepath.Join(dir, "api.yaml")) {
		t.Fatalf("Apply on a file's domain: %v", err)
	}
	if _, err := a.Delete(ctx, "api", Guard{}); !errors.Is(err, ErrOwned) {
		t.Fatalf("Delete of a file's domain: %v", err)
	}

	// A restart with the file changed: the file is in force, web stays.
	// (The file system's clock may not have moved since the first write.)
	changed := writeSource(t, dir, map[string]int{"api": 3})
	changed[0].Stamp = firstFiles[0].Stamp.Add(time.Millisecond)
	b := newStore(t, newRedisBackend(t, srv.Addr()), Options{Files: changed})
	if requestsOf(b.Current(), "api") != 3 || requestsOf(b.Current(), "web") != 5 {
		t.Fatalf("restart with a changed file: %+v", b.Current().Policies())
	}
	waitFor(t, a, convergeBound, "the first replica follows", func(s *Snapshot) bool { return requestsOf(s, "api") == 3 })

	// Older files (another pod's, written before) change nothing.
	old := writeSource(t, dir, map[string]int{"api": 3})
	old[0].Stamp = old[0].Stamp.Add(-time.Hour)
	old[0].Files[0].Data = domainYAML("api", 99)
	old[0].Files[0].Domain = mustParse(t, old[0].Files[0].Data)
	res, err := b.PutFiles(ctx, old)
	if err != nil || res[0].Outcome != Older || requestsOf(b.Current(), "api") != 3 {
		t.Fatalf("older files: %+v, %v, api %d", res, err, requestsOf(b.Current(), "api"))
	}
}

// TestFilesWhileStoreDown: a replica that cannot reach Redis at start
// serves its files, then puts them in force once it can, over what the
// store held, without serving the store's older version in between.
func TestFilesWhileStoreDown(t *testing.T) {
	srv := redistest.StartServer(t)
	ctx := context.Background()
	first := newStore(t, newRedisBackend(t, srv.Addr()), Options{})
	if _, err := first.Apply(ctx, "api.yaml", domainYAML("api", 10), Guard{}); err != nil {
		t.Fatal(err)
	}
	link := startProxy(t, srv.Addr())
	link.Cut()
	files := writeSource(t, filepath.Join(t.TempDir(), "p"), map[string]int{"api": 4})
	s, err := New(ctx, newRedisBackend(t, link.Addr()), Options{Files: files, Logger: testLogger(t), Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Ready() || requestsOf(s.Current(), "api") != 4 {
		t.Fatalf("without Redis: ready %v, api %d; want the files", s.Ready(), requestsOf(s.Current(), "api"))
	}
	link.Restore()
	waitFor(t, s, convergeBound, "the files put in force once Redis is up", func(snap *Snapshot) bool {
		if got := requestsOf(snap, "api"); got != 4 {
			t.Fatalf("served api %d at version %d; want 4 (the files) throughout", got, snap.Version)
		}
		return snap.Version > 0
	})
	waitFor(t, first, convergeBound, "the other replica follows", func(snap *Snapshot) bool { return requestsOf(snap, "api") == 4 })
}

// TestReadSources: each path is a source with its files; the files' time
// is their change time, which a file put in place with an old
// modification time (restored from a backup, untarred) does not hide.
func TestReadSources(t *testing.T) {
	dir := t.TempDir()
	pdir := filepath.Join(dir, "policies")
	writeSource(t, pdir, map[string]int{"a": 1, "b": 2})
	single := filepath.Join(dir, "c.yaml")
	if err := os.WriteFile(single, domainYAML("c", 3), 0o644); err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	old := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := os.Chtimes(single, old, old); err != nil {
		t.Fatal(err)
	}
	srcs, err := ReadSources(pdir+"/", single)
	if err != nil {
		t.Fatal(err)
	}
	if len(srcs) != 2 || srcs[0].Path != pdir || len(srcs[0].Files) != 2 || srcs[1].Path != single || len(srcs[1].Files) != 1 {
		t.Fatalf("sources %+v", srcs)
	}
	if srcs[1].Stamp.Before(before.Add(-time.Second)) {
		t.Errorf("a file with an old modification time, just put in place: stamp %v, want its change time (about %v)", srcs[1].Stamp, before)
	}
	again, _ := ReadSources(pdir, single)
	if srcs[0].state().Hash != again[0].state().Hash || srcs[0].state().Hash == srcs[1].state().Hash {
		t.Error("the hash of the same files differs, or two sources hash alike")
	}
	if r := srcs[0].state().Records; len(r) != 2 || r[0].Owner != filepath.Join(pdir, "a.yaml") || r[1].Domain != "b" {
		t.Errorf("records %+v", r)
	}
}
