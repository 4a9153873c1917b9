package policy

import (
	"errors"
	"strings"
	"testing"
)

// limitDoc wraps a rate_limit body (indented by 6) in a one-descriptor
// domain; the body starts on line 5.
func limitDoc(body string) string {
	return "domain: api\ndescriptors:\n  - key: k\n    rate_limit:\n" + body
}

func TestValidationErrors(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		want []string // every error, in order, exactly
	}{
		// Documents.
		{"empty document", "", []string{
			`v.yaml: empty policy: expected a mapping with domain and descriptors`}},
		{"only a comment", "# nothing\n", []string{
			`v.yaml: empty policy: expected a mapping with domain and descriptors`}},
		{"yaml syntax", "domain: api\ndescriptors:\n  - key: [\n", []string{
			`v.yaml:3: invalid YAML: did not find expected node content`}},
		{"two documents", "domain: a\n---\ndomain: b\n", []string{
			`v.yaml:2: a second YAML document: put one domain per file (or per Apply)`}},
		{"trailing empty document is fine, a third is not", "domain: a\n---\n---\ndomain: b\n", []string{
			`v.yaml:3: a second YAML document: put one domain per file (or per Apply)`}},
		{"root not a mapping", "- domain: api\n", []string{
			`v.yaml:1: must be a mapping, got a list`}},

		// Domain.
		{"missing domain", "descriptors: []\n", []string{
			`v.yaml:1: domain: required: name the domain the descriptors belong to`}},
		{"empty domain", "domain: \"\"\n", []string{
			`v.yaml:1: domain: must not be empty`}},
		{"null domain", "domain:\n", []string{
			`v.yaml:1: domain: required: name the domain the descriptors belong to`}},
		{"domain with newline", "domain: \"a\\nb\"\n", []string{
			`v.yaml:1: domain: must not contain control characters (got "a\nb")`}},
		{"domain not a string", "domain: [a]\n", []string{
			`v.yaml:1: domain: must be a string, got a list`}},
		{"misspelled root field", "domain: api\ndescriptor:\n  - key: k\n", []string{
			`v.yaml:2: domain "api": descriptor: unknown field (did you mean "descriptors"?)`}},
		{"descriptor field at the root", "domain: api\nkey: k\n", []string{
			`v.yaml:2: domain "api": key: unknown field (key belongs under descriptors)`}},
		{"repeated field", "domain: api\ndomain: api2\n", []string{
			`v.yaml:2: domain "api": domain: repeated field (first at line 1)`}},
		{"merge key", "domain: api\ndescriptors:\n  - <<: {key: k}\n", []string{
			`v.yaml:3: domain "api": descriptors[0].<<: merge keys (<<) are not supported: write the fields out`,
			`v.yaml:3: domain "api": descriptors[0].key: required`}},
		{"bad domain failure_mode", "domain: api\nfailure_mode: maybe\n", []string{
			`v.yaml:2: domain "api": failure_mode: unknown failure_mode "maybe" (want open or closed)`}},
		{"response_headers not a boolean", "domain: api\nresponse_headers: \"true\"\n", []string{
			`v.yaml:2: domain "api": response_headers: must be true or false, got "true"`}},
		{"domain error names the domain defined later", "descriptors: 5\ndomain: late\n", []string{
			`v.yaml:1: domain "late": descriptors: must be a list, got the integer 5`}},

		// Descriptors.
		{"descriptor not a mapping", "domain: api\ndescriptors:\n  - k\n", []string{
			`v.yaml:3: domain "api": descriptors[0]: must be a mapping, got "k"`}},
		{"missing key", "domain: api\ndescriptors:\n  - value: v\n", []string{
			`v.yaml:3: domain "api": descriptors[0].key: required`}},
		{"empty key", "domain: api\ndescriptors:\n  - key: ''\n", []string{
			`v.yaml:3: domain "api": descriptors[0].key: must not be empty`}},
		{"key not a scalar", "domain: api\ndescriptors:\n  - key: {a: b}\n", []string{
			`v.yaml:3: domain "api": descriptors[0].key: must be a string, got a mapping`}},
		{"non-string field name", "domain: api\ndescriptors:\n  - ? [a]\n    : b\n    key: k\n", []string{
			`v.yaml:3: domain "api": descriptors[0]: field names must be strings, got a list`}},
		{"duplicate key and value", "domain: api\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n", []string{
			`v.yaml:5: domain "api": descriptors[1]: duplicate descriptor key "k" value "v" (first at line 3)`}},
		{"duplicate key only", "domain: api\ndescriptors:\n  - key: x\n    descriptors:\n      - key: k\n      - key: k\n", []string{
			`v.yaml:6: domain "api": descriptors[0].descriptors[1]: duplicate descriptor key "k" (first at line 5)`}},
		{"limit field on the descriptor", "domain: api\ndescriptors:\n  - key: k\n    requests_per_unit: 4\n", []string{
			`v.yaml:4: domain "api": descriptors[0].requests_per_unit: unknown field (requests_per_unit belongs under rate_limit)`}},
		{"misspelled rate_limit", "domain: api\ndescriptors:\n  - key: k\n    rate_limt: {unit: second}\n", []string{
			`v.yaml:4: domain "api": descriptors[0].rate_limt: unknown field (did you mean "rate_limit"?)`}},
		{"share_threshold without a wildcard", "domain: api\ndescriptors:\n  - key: k\n    value: a\n    share_threshold: true\n", []string{
			`v.yaml:5: domain "api": descriptors[0].share_threshold: needs a wildcard value (containing *): every value the wildcard matches then shares one counter (value is "a")`}},
		{"shadow_mode not a boolean", "domain: api\ndescriptors:\n  - key: k\n    shadow_mode: maybe\n", []string{
			`v.yaml:4: domain "api": descriptors[0].shadow_mode: must be true or false, got "maybe"`}},
		{"bad descriptor failure_mode", "domain: api\ndescriptors:\n  - key: k\n    failure_mode: half\n", []string{
			`v.yaml:4: domain "api": descriptors[0].failure_mode: unknown failure_mode "half" (want open or closed)`}},
		{"rate_limit and rate_limits", "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n    rate_limits: []\n", []string{
			`v.yaml:5: domain "api": descriptors[0].rate_limits: rate_limit and rate_limits are mutually exclusive: put every limit under rate_limits`}},
		{"unlimited among several", "domain: api\ndescriptors:\n  - key: k\n    rate_limits:\n      - unlimited: true\n      - {unit: second, requests_per_unit: 1}\n", []string{
			`v.yaml:5: domain "api": descriptors[0].rate_limits: an unlimited limit must be the only limit of its descriptor`}},
		{"rate_limits not a list", "domain: api\ndescriptors:\n  - key: k\n    rate_limits: {unit: second}\n", []string{
			`v.yaml:4: domain "api": descriptors[0].rate_limits: must be a list, got a mapping`}},

		// Limits: the example from the task, nested three levels.
		{"negative requests deep down", "domain: api\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n      - key: c\n      - key: d\n        rate_limit:\n          unit: second\n          requests_per_unit: -5\n", nil},
		{"rate_limit not a mapping", limitDoc("      second\n"), []string{
			`v.yaml:5: domain "api": descriptors[0].rate_limit: must be a mapping, got "second"`}},
		{"no unit or window", limitDoc("      requests_per_unit: 5\n"), []string{
			`v.yaml:5: domain "api": descriptors[0].rate_limit: needs exactly one of unit (second, minute, hour, day, week, month, year) or window (e.g. 30s, 5m, 1h30m)`}},
		{"unit and window", limitDoc("      unit: second\n      window: 1s\n      requests_per_unit: 5\n"), []string{
			`v.yaml:6: domain "api": descriptors[0].rate_limit.window: unit and window are mutually exclusive: use one`}},
		{"unknown unit", limitDoc("      unit: fortnight\n      requests_per_unit: 5\n"), []string{
			`v.yaml:5: domain "api": descriptors[0].rate_limit.unit: unknown unit "fortnight" (want second, minute, hour, day, week, month or year)`}},
		{"unit UNKNOWN", limitDoc("      unit: UNKNOWN\n      requests_per_unit: 5\n"), []string{
			`v.yaml:5: domain "api": descriptors[0].rate_limit.unit: unknown unit "UNKNOWN" (want second, minute, hour, day, week, month or year)`}},
		{"unknown algorithm", limitDoc("      algorithm: leaky_bucket\n      unit: second\n      requests_per_unit: 5\n"), []string{
			`v.yaml:5: domain "api": descriptors[0].rate_limit.algorithm: unknown algorithm "leaky_bucket" (want fixed_window, sliding_window, sliding_log, token_bucket, gcra or reserve)`}},
		{"window without unit", limitDoc("      window: 30\n      requests_per_unit: 5\n"), []string{
			`v.yaml:5: domain "api": descriptors[0].rate_limit.window: must be a duration with a unit, e.g. 30s, 5m or 1h30m (got the integer 30)`}},
		{"window in days", limitDoc("      window: 1d\n      requests_per_unit: 5\n"), []string{
			`v.yaml:5: domain "api": descriptors[0].rate_limit.window: not a duration: "1d" (use ns, us, ms, s, m or h, e.g. 30s, 5m, 1h30m, 24h)`}},
		{"zero window", limitDoc("      window: 0s\n      requests_per_unit: 5\n"), []string{
			`v.yaml:5: domain "api": descriptors[0].rate_limit.window: must be > 0 (got 0s)`}},
		{"negative window", limitDoc("      window: -5m\n      requests_per_unit: 5\n"), []string{
			`v.yaml:5: domain "api": descriptors[0].rate_limit.window: must be > 0 (got -5m)`}},
		{"sub-microsecond window", limitDoc("      window: 1500ns\n      requests_per_unit: 5\n"), []string{
			`v.yaml:5: domain "api": descriptors[0].rate_limit.window: must be a whole number of microseconds, the resolution of the Redis clock (got 1500ns)`}},
		{"window over 73 years", limitDoc("      window: 700000h\n      requests_per_unit: 5\n"), []string{
			`v.yaml:5: domain "api": descriptors[0].rate_limit.window: must be at most 640511h56m49.213693952s (2^61 ns, the algorithms' time span bound; got 700000h0m0s)`}},
		{"missing requests", limitDoc("      unit: second\n"), []string{
			`v.yaml:5: domain "api": descriptors[0].rate_limit.requests_per_unit: required (or set unlimited: true)`}},
		{"zero requests on a token bucket", limitDoc("      algorithm: token_bucket\n      unit: second\n      requests_per_unit: 0\n"), []string{
			`v.yaml:7: domain "api": descriptors[0].rate_limit.requests_per_unit: 0 (refuse every request, as envoyproxy/ratelimit reads it) is only accepted with fixed_window (algorithm is token_bucket)`}},
		{"requests over uint32", limitDoc("      unit: second\n      requests_per_unit: 4294967296\n"), []string{
			`v.yaml:6: domain "api": descriptors[0].rate_limit.requests_per_unit: must be at most 4294967295 (RLS reports it as a uint32; got 4294967296)`}},
		{"requests out of int64", limitDoc("      unit: second\n      requests_per_unit: 99999999999999999999\n"), []string{
			`v.yaml:6: domain "api": descriptors[0].rate_limit.requests_per_unit: integer out of range (got 99999999999999999999)`}},
		{"requests as a string", limitDoc("      unit: second\n      requests_per_unit: \"5\"\n"), []string{
			`v.yaml:6: domain "api": descriptors[0].rate_limit.requests_per_unit: must be an integer, got "5"`}},
		{"requests as a float", limitDoc("      unit: second\n      requests_per_unit: 2.5\n"), []string{
			`v.yaml:6: domain "api": descriptors[0].rate_limit.requests_per_unit: must be an integer, got the number 2.5`}},
		{"burst on fixed_window", limitDoc("      unit: second\n      requests_per_unit: 5\n      burst: 10\n"), []string{
			`v.yaml:7: domain "api": descriptors[0].rate_limit.burst: only token_bucket, gcra and reserve take a burst (algorithm is fixed_window)`}},
		{"burst on sliding_log", limitDoc("      algorithm: sliding_log\n      unit: second\n      requests_per_unit: 5\n      burst: 10\n"), []string{
			`v.yaml:8: domain "api": descriptors[0].rate_limit.burst: only token_bucket, gcra and reserve take a burst (algorithm is sliding_log)`}},
		{"zero burst", limitDoc("      algorithm: token_bucket\n      unit: second\n      requests_per_unit: 5\n      burst: 0\n"), []string{
			`v.yaml:8: domain "api": descriptors[0].rate_limit.burst: must be >= 1 (got 0)`}},
		{"burst over uint32", limitDoc("      algorithm: gcra\n      unit: second\n      requests_per_unit: 5\n      burst: 5000000000\n"), []string{
			`v.yaml:8: domain "api": descriptors[0].rate_limit.burst: must be at most 4294967295 (got 5000000000)`}},
		{"unlimited with unit", limitDoc("      unlimited: true\n      unit: second\n"), []string{
			`v.yaml:6: domain "api": descriptors[0].rate_limit.unit: must not be set when unlimited is true`}},
		{"unlimited with algorithm", limitDoc("      unlimited: true\n      algorithm: gcra\n"), []string{
			`v.yaml:6: domain "api": descriptors[0].rate_limit.algorithm: must not be set when unlimited is true`}},
		{"unknown limit field", limitDoc("      unit: second\n      requests_per_unit: 5\n      bursts: 3\n"), []string{
			`v.yaml:7: domain "api": descriptors[0].rate_limit.bursts: unknown field (did you mean "burst"?)`}},
		{"descriptor field in the limit", limitDoc("      unit: second\n      requests_per_unit: 5\n      shadow_mode: true\n"), []string{
			`v.yaml:7: domain "api": descriptors[0].rate_limit.shadow_mode: unknown field (shadow_mode belongs under the descriptor)`}},
		{"unit_multiplier zero", limitDoc("      unit: second\n      unit_multiplier: 0\n      requests_per_unit: 5\n"), []string{
			`v.yaml:6: domain "api": descriptors[0].rate_limit.unit_multiplier: must be >= 1 (got 0)`}},
		{"unit_multiplier with window", limitDoc("      window: 5s\n      unit_multiplier: 2\n      requests_per_unit: 5\n"), []string{
			`v.yaml:6: domain "api": descriptors[0].rate_limit.unit_multiplier: applies to unit only: with window, write the whole duration`}},

		// Names and replaces.
		{"duplicate limit name", "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {name: n, unit: second, requests_per_unit: 1}\n  - key: b\n    descriptors:\n      - key: c\n        rate_limit: {name: n, unit: second, requests_per_unit: 1}\n", []string{
			`v.yaml:8: domain "api": descriptors[1].descriptors[0].rate_limit.name: duplicate limit name "n" (first at line 4, descriptors[0].rate_limit): names must be unique within a domain`}},
		{"replaces unknown name", limitDoc("      unit: second\n      requests_per_unit: 5\n      replaces:\n        - name: ghost\n"), []string{
			`v.yaml:8: domain "api": descriptors[0].rate_limit.replaces[0].name: unknown limit name "ghost": no rate_limit in this domain has that name`}},
		{"replaces itself", limitDoc("      name: me\n      unit: second\n      requests_per_unit: 5\n      replaces:\n        - name: me\n"), []string{
			`v.yaml:9: domain "api": descriptors[0].rate_limit.replaces[0].name: a limit cannot replace itself ("me")`}},
		{"replaces empty name", limitDoc("      unit: second\n      requests_per_unit: 5\n      replaces:\n        - name: \"\"\n"), []string{
			`v.yaml:8: domain "api": descriptors[0].rate_limit.replaces[0].name: must not be empty`}},
		{"replaces without name", limitDoc("      unit: second\n      requests_per_unit: 5\n      replaces:\n        - {}\n"), []string{
			`v.yaml:8: domain "api": descriptors[0].rate_limit.replaces[0].name: required: the name of the limit to replace`}},
		{"replaces as a list of strings", limitDoc("      unit: second\n      requests_per_unit: 5\n      replaces: [a]\n"), []string{
			`v.yaml:7: domain "api": descriptors[0].rate_limit.replaces[0]: must be a mapping, got "a"`}},

		// Bounds that keep the arithmetic exact (natively and in Redis Lua).
		{"sliding_log too large", limitDoc("      algorithm: sliding_log\n      unit: second\n      requests_per_unit: 100001\n"), []string{
			`v.yaml:7: domain "api": descriptors[0].rate_limit.requests_per_unit: sliding_log keeps one entry per admitted request: at most 100000 (got 100001); use sliding_window for larger limits`}},
		{"sliding_window month", limitDoc("      algorithm: sliding_window\n      unit: month\n      requests_per_unit: 5\n"), []string{
			`v.yaml:6: domain "api": descriptors[0].rate_limit.unit: sliding_window: must be at most 640h30m43.009213693s (window x 1000 must stay within 2^61 ns; got 720h0m0s); use fixed_window or token_bucket for longer windows`}},
		{"token_bucket burst x window", limitDoc("      algorithm: token_bucket\n      unit: year\n      requests_per_unit: 5\n      burst: 100000\n"), []string{
			`v.yaml:8: domain "api": descriptors[0].rate_limit.burst: token_bucket: burst x window must be at most 640511h56m49.213693952s (2^61 ns) so the bucket arithmetic stays exact (got 100000 x 8760h0m0s); lower burst or window`}},
		{"token_bucket default burst x window", limitDoc("      algorithm: token_bucket\n      window: 87600h\n      requests_per_unit: 10000\n"), []string{
			`v.yaml:5: domain "api": descriptors[0].rate_limit: token_bucket: burst x window must be at most 640511h56m49.213693952s (2^61 ns) so the bucket arithmetic stays exact (got 10000 x 87600h0m0s); lower burst or window`}},
		{"gcra faster than a microsecond", limitDoc("      algorithm: gcra\n      unit: second\n      requests_per_unit: 2000000\n"), []string{
			`v.yaml:7: domain "api": descriptors[0].rate_limit.requests_per_unit: gcra: at most one request per microsecond of window (the emission interval window/requests must be >= 1µs; got 2000000 per 1s)`}},
		{"gcra burst x interval", limitDoc("      algorithm: gcra\n      unit: year\n      requests_per_unit: 1\n      burst: 1000\n"), []string{
			`v.yaml:8: domain "api": descriptors[0].rate_limit.burst: gcra: burst x emission interval (window/requests) must be at most 640511h56m49.213693952s (2^61 ns) so the arithmetic stays exact (got 1000 x 8760h0m0s); lower burst or window`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := Parse("v.yaml", []byte(tt.doc))
			if err == nil {
				t.Fatalf("no error; parsed %+v", d)
			}
			if d != nil {
				t.Error("a domain returned with an error")
			}
			var list ErrorList
			if !errors.As(err, &list) {
				t.Fatalf("error is %T, want ErrorList", err)
			}
			want := tt.want
			if want == nil { // the task's own example
				want = []string{`v.yaml:10: domain "api": descriptors[0].descriptors[2].rate_limit.requests_per_unit: must be > 0 (got -5)`}
			}
			got := strings.Split(err.Error(), "\n")
			if strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Errorf("errors:\n got  %q\n want %q", got, want)
			}
			for _, e := range list {
				if e.File != "v.yaml" || e.Line == 0 && !strings.Contains(e.Problem, "empty policy") {
					t.Errorf("error without file or line: %+v", e)
				}
			}
		})
	}
}

// TestValidationCollectsAll checks that one Parse reports every problem, in
// line order, and stops after 50.
func TestValidationCollectsAll(t *testing.T) {
	doc := "domain: api\ndescriptors:\n" +
		"  - key: a\n    rate_limit: {unit: parsec, requests_per_unit: 1}\n" +
		"  - key: b\n    rate_limit: {name: x, unit: second, requests_per_unit: -1, replaces: [{name: nope}]}\n" +
		"  - key: ''\n"
	_, err := Parse("v.yaml", []byte(doc))
	var list ErrorList
	if !errors.As(err, &list) {
		t.Fatalf("got %v", err)
	}
	var lines []int
	for _, e := range list {
		lines = append(lines, e.Line)
	}
	if len(list) != 4 || lines[0] != 4 || lines[1] != 6 || lines[2] != 6 || lines[3] != 7 {
		t.Errorf("got %d errors at lines %v:\n%v", len(list), lines, err)
	}

	var b strings.Builder
	b.WriteString("domain: api\ndescriptors:\n")
	for i := 0; i < 200; i++ {
		b.WriteString("  - key: ''\n")
	}
	_, err = Parse("v.yaml", []byte(b.String()))
	if !errors.As(err, &list) || len(list) != maxErrors+1 || !strings.HasSuffix(err.Error(), "too many errors; stopping here") {
		t.Errorf("got %d errors, last %q", len(list), list[len(list)-1])
	}
}
