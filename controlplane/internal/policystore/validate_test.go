package policystore

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/controlplane/policy"
)

// invalidPolicies holds one policy per validation rule, with what its error
// must say: the source and line, the domain and field path, and a word of
// the problem (not the whole sentence, which the policy package owns).
var invalidPolicies = []struct {
	name string
	yaml string
	want []string // substrings of the error
}{
	{"missing domain", "descriptors: []\n", []string{"p.yaml:1: ", "domain: required"}},
	{"empty domain", "domain: \"\"\n", []string{"p.yaml:1: ", "domain: must not be empty"}},
	{"domain not a string", "domain: [a]\n", []string{"p.yaml:1: ", "domain: must be a string"}},
	{"domain with a control character", "domain: \"a\\tb\"\n", []string{"p.yaml:1: ", "domain: ", "control"}},
	{"not a mapping", "- a\n", []string{"p.yaml:1: ", "mapping"}},
	{"invalid YAML", "domain: api\ndescriptors: [\n", []string{"p.yaml:2: ", "invalid YAML"}},
	{"empty document", "", []string{"p.yaml: ", "empty policy"}},
	{"two documents", "domain: a\n---\ndomain: b\n", []string{"p.yaml:2: ", "second YAML document"}},
	{"unknown field", "domain: api\nbogus: 1\n", []string{`p.yaml:2: domain "api": bogus: unknown field`}},
	{"misspelt field", "domain: api\ndescriptor: []\n", []string{`p.yaml:2: domain "api": descriptor: unknown field`, `"descriptors"`}},
	{"bad failure_mode", "domain: api\nfailure_mode: maybe\n", []string{`p.yaml:2: domain "api": failure_mode: `, `"maybe"`}},
	{"bad response_headers", "domain: api\nresponse_headers: 3\n", []string{`p.yaml:2: domain "api": response_headers: `, "true or false"}},
	{"descriptor without key", "domain: api\ndescriptors:\n  - value: x\n", []string{`p.yaml:3: domain "api": descriptors[0].key: required`}},
	{"empty key", "domain: api\ndescriptors:\n  - key: \"\"\n", []string{`p.yaml:3: domain "api": descriptors[0].key: must not be empty`}},
	{"duplicate descriptor", "domain: api\ndescriptors:\n  - key: a\n  - key: a\n", []string{`p.yaml:4: domain "api": descriptors[1]: duplicate descriptor`}},
	{"bad shadow_mode", "domain: api\ndescriptors:\n  - key: a\n    shadow_mode: maybe\n", []string{`p.yaml:4: domain "api": descriptors[0].shadow_mode: `}},
	{"rate_limit and rate_limits", "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n    rate_limits: []\n",
		[]string{`p.yaml:5: domain "api": descriptors[0].rate_limits: `, "mutually exclusive"}},
	{"unlimited among limits", "domain: api\ndescriptors:\n  - key: a\n    rate_limits:\n      - unlimited: true\n      - {unit: second, requests_per_unit: 1}\n",
		[]string{`domain "api": descriptors[0].rate_limits: `, "unlimited"}},
	{"unlimited with a unit", "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, unit: second}\n",
		[]string{`p.yaml:4: domain "api": descriptors[0].rate_limit.unit: `, "unlimited"}},
	{"unknown unit", "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
		[]string{`p.yaml:4: domain "api": descriptors[0].rate_limit.unit: `, `"fortnight"`}},
	{"nested unknown unit", "domain: api\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        rate_limit: {unit: sec, requests_per_unit: 1}\n",
		[]string{`p.yaml:6: domain "api": descriptors[0].descriptors[0].rate_limit.unit: `, `"sec"`}},
	{"unit and window", "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, window: 1s, requests_per_unit: 1}\n",
		[]string{`p.yaml:4: domain "api": descriptors[0].rate_limit.window: `, "mutually exclusive"}},
	{"no unit or window", "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {requests_per_unit: 1}\n",
		[]string{`p.yaml:4: domain "api": descriptors[0].rate_limit: `, "unit", "window"}},
	{"window not a duration", "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {window: soon, requests_per_unit: 1}\n",
		[]string{`p.yaml:4: domain "api": descriptors[0].rate_limit.window: `, `"soon"`}},
	{"negative window", "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {window: -1s, requests_per_unit: 1}\n",
		[]string{`p.yaml:4: domain "api": descriptors[0].rate_limit.window: `, "> 0"}},
	{"window below a microsecond", "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {window: 1500ns, requests_per_unit: 1}\n",
		[]string{`p.yaml:4: domain "api": descriptors[0].rate_limit.window: `, "microseconds"}},
	{"missing requests_per_unit", "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {unit: second}\n",
		[]string{`p.yaml:4: domain "api": descriptors[0].rate_limit.requests_per_unit: required`}},
	{"zero requests_per_unit on a token bucket", "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {algorithm: token_bucket, unit: second, requests_per_unit: 0}\n",
		[]string{`p.yaml:4: domain "api": descriptors[0].rate_limit.requests_per_unit: 0 (refuse every request`}},
	{"negative requests_per_unit", "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: -5}\n",
		[]string{`p.yaml:4: domain "api": descriptors[0].rate_limit.requests_per_unit: `}},
	{"requests_per_unit past uint32", "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 4294967296}\n",
		[]string{`p.yaml:4: domain "api": descriptors[0].rate_limit.requests_per_unit: `, "4294967295"}},
	{"burst on fixed_window", "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5, burst: 9}\n",
		[]string{`p.yaml:4: domain "api": descriptors[0].rate_limit.burst: `, "token_bucket, gcra and reserve"}},
	{"zero burst", "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {algorithm: gcra, unit: second, requests_per_unit: 5, burst: 0}\n",
		[]string{`p.yaml:4: domain "api": descriptors[0].rate_limit.burst: `, ">= 1"}},
	{"unknown algorithm", "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {algorithm: leaky, unit: second, requests_per_unit: 5}\n",
		[]string{`p.yaml:4: domain "api": descriptors[0].rate_limit.algorithm: `, `"leaky"`}},
	{"duplicate limit name", "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {name: n, unit: second, requests_per_unit: 5}\n  - key: b\n    rate_limit: {name: n, unit: second, requests_per_unit: 5}\n",
		[]string{`p.yaml:6: domain "api": descriptors[1].rate_limit.name: `, `"n"`}},
	{"replaces an unknown name", "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5, replaces: [{name: nope}]}\n",
		[]string{`p.yaml:4: domain "api": descriptors[0].rate_limit.replaces[0].name: `, `"nope"`}},
	{"replaces itself", "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {name: me, unit: second, requests_per_unit: 5, replaces: [{name: me}]}\n",
		[]string{`p.yaml:4: domain "api": descriptors[0].rate_limit.replaces[0].name: `, "itself"}},
	{"sliding_log too large", "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {algorithm: sliding_log, unit: second, requests_per_unit: 100001}\n",
		[]string{`p.yaml:4: domain "api": descriptors[0].rate_limit.requests_per_unit: `, "sliding_log"}},
	{"sliding_window too long", "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {algorithm: sliding_window, unit: year, requests_per_unit: 5}\n",
		[]string{`p.yaml:4: domain "api": descriptors[0].rate_limit.unit: `, "sliding_window"}},
	{"gcra faster than a microsecond", "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {algorithm: gcra, window: 1ms, requests_per_unit: 5000}\n",
		[]string{`p.yaml:4: domain "api": descriptors[0].rate_limit.requests_per_unit: `, "gcra"}},
	{"token_bucket too large", "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {algorithm: token_bucket, unit: year, requests_per_unit: 5, burst: 4000000000}\n",
		[]string{`p.yaml:4: domain "api": descriptors[0].rate_limit.burst: `, "token_bucket"}},
	{"not UTF-8", "domain: \"\xff\xfe\"\n", []string{"p.yaml: ", "UTF-8"}},
	{"too large", "domain: api\n#" + strings.Repeat("x", MaxPolicySize) + "\n", []string{"p.yaml: ", "too large"}},
	// Issue 12's hostile documents: each grew memory without limit on Apply.
	{"alias cycle", "domain: api\ndescriptors: &d [{key: k, descriptors: *d}]\n",
		[]string{`p.yaml:2: domain "api": descriptors[0].descriptors: alias *d refers to a node that contains it`}},
	{"4,990 levels", "domain: api\ndescriptors: " + strings.Repeat("[{key: k, descriptors: ", 4990) + "[]" + strings.Repeat("}]", 4990) + "\n",
		[]string{`p.yaml:2: domain "api": descriptors[0].descriptors[0]`, "nested too deeply"}},
	{"long domain", "domain: " + strings.Repeat("d", 300) + "\n", []string{`p.yaml:1: domain: too long: 300 bytes (at most 256)`}},
}

// TestInvalidPoliciesChangeNothing: each rule's violation is refused with
// an error naming source, line, domain and field, and the store (backend
// and snapshot) is left exactly as it was.
func TestInvalidPoliciesChangeNothing(t *testing.T) {
	b, err := NewFile(filepath.Join(t.TempDir(), "p.json"))
	if err != nil {
		t.Fatal(err)
	}
	s := newStore(t, b, Options{})
	ctx := context.Background()
	if _, err := s.Apply(ctx, "api.yaml", domainYAML("api", 3), Guard{}); err != nil {
		t.Fatal(err)
	}
	before, err := b.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	snap := s.Current()
	for _, tc := range invalidPolicies {
		t.Run(tc.name, func(t *testing.T) {
			res, err := s.Apply(ctx, "p.yaml", []byte(tc.yaml), Guard{})
			var list policy.ErrorList
			if !errors.As(err, &list) {
				t.Fatalf("Apply = %+v, %v; want a policy.ErrorList", res, err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			after, err := b.Load(ctx)
			if err != nil || !reflect.DeepEqual(after, before) {
				t.Fatalf("store changed: %+v, %v; want %+v", after, err, before)
			}
			if s.Current() != snap {
				t.Fatal("the replica's snapshot changed")
			}
		})
	}
}

// TestApplyErrorsAreComplete: several problems in one document are all
// reported, each on its own line.
func TestApplyErrorsAreComplete(t *testing.T) {
	b, err := NewFile(filepath.Join(t.TempDir(), "p.json"))
	if err != nil {
		t.Fatal(err)
	}
	s := newStore(t, b, Options{})
	_, err = s.Apply(context.Background(), "multi.yaml", []byte(`domain: api
descriptors:
  - key: a
    rate_limit: {unit: fortnight, requests_per_unit: 1}
  - key: b
    rate_limit: {unit: second, requests_per_unit: -1}
`), Guard{})
	var list policy.ErrorList
	if !errors.As(err, &list) || len(list) != 2 {
		t.Fatalf("err = %v; want two errors", err)
	}
	if list[0].Line != 4 || list[0].Field != "descriptors[0].rate_limit.unit" ||
		list[1].Line != 6 || list[1].Field != "descriptors[1].rate_limit.requests_per_unit" {
		t.Fatalf("errors %+v %+v; want lines 4 and 6 with their fields", list[0], list[1])
	}
}

// limitsYAML is a policy for domain with n descriptors of one limit each.
func limitsYAML(domain string, n int) []byte {
	b := fmt.Appendf(nil, "domain: %s\ndescriptors:\n", domain)
	for i := 0; i < n; i++ {
		b = fmt.Appendf(b, "  - {key: k, value: v%d, rate_limit: {unit: second, requests_per_unit: 1}}\n", i)
	}
	return b
}

// TestApplySetBounds: Apply keeps the stored set within the set bounds of
// the policy package, as -policy does at start-up: an Apply that takes the
// set past MaxLimits is refused as an invalid policy naming the bound and
// changes nothing; replacing a domain counts it once.
func TestApplySetBounds(t *testing.T) {
	b, err := NewFile(filepath.Join(t.TempDir(), "policies.json"))
	if err != nil {
		t.Fatal(err)
	}
	st := newStore(t, b, Options{})
	ctx := context.Background()
	for _, d := range []string{"a", "b", "c"} {
		if _, err := st.Apply(ctx, d+".yaml", limitsYAML(d, 3000), Guard{}); err != nil {
			t.Fatalf("apply %s: %v", d, err)
		}
	}
	before := st.Current().Version
	_, err = st.Apply(ctx, "d.yaml", limitsYAML("d", 1001), Guard{})
	var list policy.ErrorList
	if !errors.As(err, &list) || !strings.Contains(err.Error(), `d.yaml: domain "d": too many limits: this domain's 1001 take the set to 10001, more than 10000`) {
		t.Fatalf("apply past the bound: %v; want a policy error naming the bound", err)
	}
	if v := st.Current().Version; v != before || st.Current().Policy("d") != nil {
		t.Fatalf("the refused apply changed the store: version %d -> %d", before, v)
	}
	if _, err := st.Apply(ctx, "d.yaml", limitsYAML("d", 1000), Guard{}); err != nil {
		t.Fatalf("apply up to the bound: %v", err)
	}
	if _, err := st.Apply(ctx, "a.yaml", limitsYAML("a", 2999), Guard{}); err != nil {
		t.Fatalf("replacing a domain within the bound: %v", err)
	}
}
