package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/controlplane/policy"
)

// TestWatchPolicies drives watchPolicies with an injected tick over a
// directory laid out as Kubernetes mounts a ConfigMap (files are symlinks
// into ..data, itself a symlink swapped on update): a tick with nothing
// changed reports nothing, a touch reports nothing, a swap of ..data
// reports once, a removed file reports.
func TestWatchPolicies(t *testing.T) {
	dir := t.TempDir()
	version := func(name, doc string) {
		v := filepath.Join(dir, name)
		if err := os.MkdirAll(v, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(v, "api.yaml"), []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		tmp := filepath.Join(dir, "..data_tmp")
		os.Remove(tmp)
		if err := os.Symlink(name, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil { // atomic swap, as kubelet does
			t.Fatal(err)
		}
	}
	version("..v1", "domain: api\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1}}]\n")
	if err := os.Symlink("..data/api.yaml", filepath.Join(dir, "api.yaml")); err != nil {
		t.Fatal(err)
	}
	watched := filepath.Join(dir, "api.yaml")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tick := make(chan time.Time)
	changed := make(chan struct{}, 1)
	done := make(chan struct{})
	go func() { watchPolicies(ctx, tick, []string{watched}, changed); close(done) }()
	step := func(name string, want bool) {
		t.Helper()
		tick <- time.Time{} // taken only when the previous tick is done
		tick <- time.Time{}
		select {
		case <-changed:
			if !want {
				t.Errorf("%s: reported a change", name)
			}
		default:
			if want {
				t.Errorf("%s: no change reported", name)
			}
		}
	}
	step("nothing changed", false)
	now := time.Now().Add(time.Minute)
	if err := os.Chtimes(filepath.Join(dir, "..v1", "api.yaml"), now, now); err != nil {
		t.Fatal(err)
	}
	step("touched", false)
	version("..v2", "domain: api\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 7}}]\n")
	step("ConfigMap updated", true)
	step("after the update", false)
	if err := os.Remove(watched); err != nil {
		t.Fatal(err)
	}
	step("file removed", true)
	cancel()
	<-done
}

// TestFingerprintBounded: a tick reads at most what a valid set can hold
// (policy.MaxSetSize): a directory of many 1 MiB files used to be read whole
// at every tick. Past the bound only names and sizes count, which is enough
// to see the change that brings the set back within it.
func TestFingerprintBounded(t *testing.T) {
	dir := t.TempDir()
	doc := []byte("domain: d\n#" + strings.Repeat("x", policy.MaxDocumentSize-20) + "\n")
	n := policy.MaxSetSize/policy.MaxDocumentSize + 2
	for i := range n {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%d.yaml", i)), doc, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	before := fingerprint([]string{dir})
	last := filepath.Join(dir, fmt.Sprintf("f%d.yaml", n-1))
	same := bytes.Replace(doc, []byte("domain: d"), []byte("domain: e"), 1)
	if err := os.WriteFile(last, same, 0o644); err != nil {
		t.Fatal(err)
	}
	if fingerprint([]string{dir}) != before {
		t.Errorf("the content of a file past %d bytes was read", policy.MaxSetSize)
	}
	if err := os.WriteFile(last, []byte("domain: e\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if fingerprint([]string{dir}) == before {
		t.Error("a file past the bound shrank, and the fingerprint did not change")
	}
}
