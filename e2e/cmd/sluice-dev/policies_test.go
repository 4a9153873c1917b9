package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	sluicev1 "github.com/sluicehq/sluice/controlplane/api/sluice/v1"
	"github.com/sluicehq/sluice/controlplane/policy"
)

// TestCompareWithSeed: the banner says the example is in force only when
// the store serves it unchanged; after a restart on a Redis that holds
// policies applied earlier, it says they came from the store.
func TestCompareWithSeed(t *testing.T) {
	t.Run("file", testCompareWithFile)
	seed, name, err := seedPolicies("")
	if err != nil {
		t.Fatal(err)
	}
	d := seed.Domain("sluice-demo")
	if d == nil {
		t.Fatal("the example has no domain sluice-demo")
	}
	y, err := policy.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	other := "domain: sluice-demo\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 3}\n"
	for _, tc := range []struct {
		name    string
		stored  []*sluicev1.Policy
		example bool
		demo    bool
		want    []string
	}{
		{"seeded", []*sluicev1.Policy{{Domain: "sluice-demo", Version: 1, Yaml: string(y)}}, true, true,
			[]string{"domain sluice-demo (version 1): from the embedded example"}},
		// The store keeps the seed file's own text, comments and spelling.
		{"seeded as written", []*sluicev1.Policy{{Domain: "sluice-demo", Version: 1, Yaml: string(d.Text())}}, true, true,
			[]string{"domain sluice-demo (version 1): from the embedded example"}},
		{"applied earlier", []*sluicev1.Policy{{Domain: "sluice-demo", Version: 4, Yaml: other}, {Domain: "api", Version: 2, Yaml: "x"}}, false, true,
			[]string{"domain sluice-demo (version 4): from the store, applied before this run; it differs from the embedded example",
				"domain api (version 2): from the store, applied before this run"}},
		{"emptied", nil, false, false, []string{"none: the store is empty"}},
		{"another domain", []*sluicev1.Policy{{Domain: "api", Version: 1, Yaml: "x"}}, false, false,
			[]string{"domain api (version 1): from the store"}},
		{"another file's", []*sluicev1.Policy{{Domain: "api", Version: 1, Yaml: "x", Owner: "/etc/api.yaml"}}, false, false,
			[]string{"domain api (version 1): from /etc/api.yaml, which owns it"}},
	} {
		got := compareWithSeed(tc.stored, seed, name, "")
		text := strings.Join(got.lines, "\n")
		if got.seedInForce != tc.example || got.demo != tc.demo {
			t.Errorf("%s: example, demo = %v, %v; want %v, %v", tc.name, got.seedInForce, got.demo, tc.example, tc.demo)
		}
		for _, w := range tc.want {
			if !strings.Contains(text, w) {
				t.Errorf("%s: lines lack %q:\n%s", tc.name, w, text)
			}
		}
	}
}

// testCompareWithFile: with a -policy file, the banner says the file is in
// force when the store serves it, owned by the file.
func testCompareWithFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "my.yaml")
	doc := "domain: sluice-demo\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 3}\n"
	if err := os.WriteFile(file, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	seed, name, err := seedPolicies(file)
	if err != nil {
		t.Fatal(err)
	}
	got := compareWithSeed([]*sluicev1.Policy{{Domain: "sluice-demo", Version: 7, Yaml: doc, Owner: file}}, seed, name, file)
	if !got.seedInForce || !strings.Contains(strings.Join(got.lines, "\n"), "domain sluice-demo (version 7): from "+file+", in force: the file owns the domain") {
		t.Errorf("in force %v, lines %q", got.seedInForce, got.lines)
	}
}
