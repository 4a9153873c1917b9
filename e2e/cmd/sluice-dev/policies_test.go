package main

import (
	"strings"
	"testing"

	sluicev1 "github.com/sluicehq/sluice/controlplane/api/sluice/v1"
	"github.com/sluicehq/sluice/controlplane/policy"
)

// TestCompareWithSeed: the banner says the example is in force only when
// the store serves it unchanged; after a restart on a Redis that holds
// policies applied earlier, it says they came from the store.
func TestCompareWithSeed(t *testing.T) {
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
		want    []string
	}{
		{"seeded", []*sluicev1.Policy{{Domain: "sluice-demo", Version: 1, Yaml: string(y)}}, true,
			[]string{"domain sluice-demo (version 1): from the embedded example"}},
		{"applied earlier", []*sluicev1.Policy{{Domain: "sluice-demo", Version: 4, Yaml: other}, {Domain: "api", Version: 2, Yaml: "x"}}, false,
			[]string{"domain sluice-demo (version 4): from the store, applied before this run; it differs from the embedded example",
				"domain api (version 2): from the store, applied before this run"}},
		{"emptied", nil, false, []string{"none: the store is empty"}},
	} {
		got := compareWithSeed(tc.stored, seed, name)
		text := strings.Join(got.lines, "\n")
		if got.example != tc.example {
			t.Errorf("%s: example = %v, want %v", tc.name, got.example, tc.example)
		}
		for _, w := range tc.want {
			if !strings.Contains(text, w) {
				t.Errorf("%s: lines lack %q:\n%s", tc.name, w, text)
			}
		}
	}
}
