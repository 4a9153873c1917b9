package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/controlplane/policy"
)

// TestWriteLowered checks the file the banner's ratectl line applies: the
// example policy with only the per-address limit changed.
func TestWriteLowered(t *testing.T) {
	example := filepath.Join("..", "..", "..", "controlplane", "policy", "example.yaml")
	out := filepath.Join(t.TempDir(), "lowered.yaml")
	if err := writeLowered(example, out, 3); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	lowered, err := policy.Parse(out, b)
	if err != nil {
		t.Fatal(err)
	}
	src, _ := os.ReadFile(example)
	orig, err := policy.Parse(example, src)
	if err != nil {
		t.Fatal(err)
	}
	if lowered.Name != orig.Name || len(lowered.Descriptors) != len(orig.Descriptors) {
		t.Fatalf("domain %q with %d descriptors, want %q with %d", lowered.Name, len(lowered.Descriptors), orig.Name, len(orig.Descriptors))
	}
	for i, d := range lowered.Descriptors {
		o := orig.Descriptors[i]
		for j, l := range d.Limits {
			want := o.Limits[j].Requests
			if d.Key == "remote_address" {
				want = 3
			}
			if l.Requests != want || l.Window != o.Limits[j].Window || l.Algorithm != o.Limits[j].Algorithm {
				t.Errorf("%s limit %d: %d per %v (%s), want %d per %v (%s)", d.Path, j, l.Requests, l.Window, l.Algorithm,
					want, o.Limits[j].Window, o.Limits[j].Algorithm)
			}
		}
	}
	if !strings.Contains(string(b), "# Every client address") {
		t.Error("the comments of the example were lost")
	}
}

func TestParseFlags(t *testing.T) {
	env := func(k string) string {
		if k == "REDIS_ADDR" {
			return "127.0.0.1:6379"
		}
		return ""
	}
	o, err := parseFlags([]string{"-listen", "127.0.0.1:18080", "-workers", "4"}, env, &strings.Builder{})
	if err != nil {
		t.Fatal(err)
	}
	if o.listen != "127.0.0.1:18080" || o.workers != 4 || o.redis != "127.0.0.1:6379" {
		t.Errorf("parsed %+v", o)
	}
	for _, args := range [][]string{{"-workers", "0"}, {"extra"}, {"-nosuchflag"}} {
		_, err := parseFlags(args, env, &strings.Builder{})
		if _, ok := err.(usageError); !ok {
			t.Errorf("parseFlags(%q) = %v, want a usage error", args, err)
		}
	}
}
