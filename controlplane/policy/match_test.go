package policy

import (
	"fmt"
	"strings"
	"testing"
)

// entries builds a request descriptor from "key=value" strings ("key" alone
// has an empty value).
func entries(kvs ...string) []Entry {
	out := make([]Entry, len(kvs))
	for i, kv := range kvs {
		k, v, _ := strings.Cut(kv, "=")
		out[i] = Entry{k, v}
	}
	return out
}

// ids returns the IDs of limits, joined by ",".
func ids(ls []*Limit) string {
	s := make([]string, len(ls))
	for i, l := range ls {
		s[i] = l.ID
	}
	return strings.Join(s, ",")
}

// TestWildcardMatch is match's table: a "*" anywhere, several of them,
// empty runs, and no overlap between the prefix and the suffix.
func TestWildcardMatch(t *testing.T) {
	for _, c := range []struct {
		pattern, value string
		want           bool
	}{
		{"foo*", "foobar", true}, {"foo*", "foo", true}, {"foo*", "fo", false},
		{"*bar", "foobar", true}, {"*bar", "barx", false},
		{"a*b*c", "abc", true}, {"a*b*c", "aXbYc", true}, {"a*b*c", "acb", false}, {"a*b*c", "aXcYb", false},
		{"ab*ba", "aba", false}, {"ab*ba", "abba", true},
		{"*", "", true}, {"**", "x", true}, {"a**b", "ab", true},
		{"/api/*/users/*", "/api/v1/users/7", true}, {"/api/*/users/*", "/api/v1/groups/7", false},
		{"x*y*y", "xyy", true}, {"x*y*y", "xy", false},
	} {
		if got := match(strings.Split(c.pattern, "*"), c.value); got != c.want {
			t.Errorf("match(%q, %q) = %v, want %v", c.pattern, c.value, got, c.want)
		}
	}
}

func TestMatch(t *testing.T) {
	noBacktrack := mustParse(t, `
domain: nb
descriptors:
  - key: a
    value: x
    descriptors:
      - key: b
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: a
    value: x*
    descriptors:
      - key: c
        rate_limit: {unit: second, requests_per_unit: 2}
  - key: a
    descriptors:
      - key: c
        rate_limit: {unit: second, requests_per_unit: 3}
  - key: "foo*"
    rate_limit: {unit: second, requests_per_unit: 4}
  - key: p
    value: "q*"
    rate_limit: {unit: second, requests_per_unit: 5}
`)
	tests := []struct {
		name    string
		domain  *Domain
		request []Entry
		want    string // limit IDs
	}{
		// ratelimit_basic.yaml: levels, defaults by key, overrides by value.
		{"key-only default at level 2", mustParseFile(t, "ratelimit_basic.yaml"), entries("tenant=acme", "user=bob"), "tenant=acme/user#0"},
		{"exact value beats key-only", mustParseFile(t, "ratelimit_basic.yaml"), entries("tenant=acme", "user=root"), "tenant=acme/user=root#0"},
		{"shallower than the limit", mustParseFile(t, "ratelimit_basic.yaml"), entries("tenant=acme"), ""},
		{"unknown first level", mustParseFile(t, "ratelimit_basic.yaml"), entries("tenant=other", "user=bob"), ""},
		{"key-only at level 1", mustParseFile(t, "ratelimit_basic.yaml"), entries("client=x"), "client#0"},
		{"override at level 1", mustParseFile(t, "ratelimit_basic.yaml"), entries("client=partner"), "client=partner#0"},
		{"whitelisted value has no limit", mustParseFile(t, "ratelimit_basic.yaml"), entries("client=internal"), ""},
		{"empty value takes key-only", mustParseFile(t, "ratelimit_basic.yaml"), entries("client"), "client#0"},
		{"limit at both levels, level 1", mustParseFile(t, "ratelimit_basic.yaml"), entries("region=eu"), "region=eu#0"},
		{"limit at both levels, level 2", mustParseFile(t, "ratelimit_basic.yaml"), entries("region=eu", "zone=eu-west"), "region=eu/zone=eu-west#0"},
		{"no key-only at level 2", mustParseFile(t, "ratelimit_basic.yaml"), entries("region=eu", "zone=us"), ""},
		{"deeper than the config", mustParseFile(t, "ratelimit_basic.yaml"), entries("region=eu", "zone=eu-west", "rack=1"), ""},
		{"descriptor without children", mustParseFile(t, "ratelimit_basic.yaml"), entries("report=x", "y=z"), ""},
		{"keys are case-sensitive", mustParseFile(t, "ratelimit_basic.yaml"), entries("Client=x"), ""},
		{"no entries", mustParseFile(t, "ratelimit_basic.yaml"), nil, ""},
		{"nil domain", nil, entries("client=x"), ""},

		// ratelimit_wildcard.yaml
		{"wildcard prefix", mustParseFile(t, "ratelimit_wildcard.yaml"), entries("wild=foo1"), "wild=foo*#0"},
		{"first wildcard in file order", mustParseFile(t, "ratelimit_wildcard.yaml"), entries("wild=foozzz"), "wild=foo*#0"},
		{"second wildcard", mustParseFile(t, "ratelimit_wildcard.yaml"), entries("wild=fa"), "wild=f*#0"},
		{"exact beats wildcard", mustParseFile(t, "ratelimit_wildcard.yaml"), entries("wild=foobar"), "wild=foobar#0"},
		{"prefix itself matches", mustParseFile(t, "ratelimit_wildcard.yaml"), entries("wild=foo"), "wild=foo*#0"},
		{"wildcard miss falls to key-only", mustParseFile(t, "ratelimit_wildcard.yaml"), entries("wild=bar"), "wild#0"},
		// A star anywhere in a value matches any run (envoyproxy/ratelimit #1085).
		{"star inside a value matches a run", mustParseFile(t, "ratelimit_wildcard.yaml"), entries("midwild=barab"), "midwild=bar*b#0"},
		{"star inside a value matches nothing", mustParseFile(t, "ratelimit_wildcard.yaml"), entries("midwild=barb"), "midwild=bar*b#0"},
		{"star inside a value matches a star", mustParseFile(t, "ratelimit_wildcard.yaml"), entries("midwild=bar*b"), "midwild=bar*b#0"},
		{"star inside a value, wrong suffix", mustParseFile(t, "ratelimit_wildcard.yaml"), entries("midwild=barbx"), ""},
		{"star inside a value, overlap", mustParseFile(t, "ratelimit_wildcard.yaml"), entries("midwild=bab"), ""},
		{"two stars", mustParseFile(t, "ratelimit_wildcard.yaml"), entries("multi=/v1/acme/users/42/orders"), "multi=%2Fv1%2F*%2Fusers%2F*%2Forders#0"},
		{"two stars, parts out of order", mustParseFile(t, "ratelimit_wildcard.yaml"), entries("multi=/v1/orders/users/x"), ""},
		{"lone star matches anything", mustParseFile(t, "ratelimit_wildcard.yaml"), entries("any=zz"), "any=*#0"},
		{"lone star matches empty", mustParseFile(t, "ratelimit_wildcard.yaml"), entries("any"), "any=*#0"},
		{"nested under wildcard", mustParseFile(t, "ratelimit_wildcard.yaml"), entries("path=/api/v1", "method=POST"), "path=%2Fapi%2F*/method=POST#0"},
		{"nested under wildcard, miss", mustParseFile(t, "ratelimit_wildcard.yaml"), entries("path=/apix", "method=POST"), ""},

		// No backtracking, and wildcards apply to values only.
		{"exact chosen, no backtrack", noBacktrack, entries("a=x", "c=1"), ""},
		{"exact chosen, child found", noBacktrack, entries("a=x", "b=1"), "a=x/b#0"},
		{"wildcard chosen, no backtrack", noBacktrack, entries("a=xy", "c=1"), "a=x*/c#0"},
		{"key-only chosen", noBacktrack, entries("a=z", "c=1"), "a/c#0"},
		{"keys are not wildcards", noBacktrack, entries("foobar=1"), ""},
		{"literal star key", noBacktrack, entries("foo*=1"), "foo*#0"},
		{"wildcard needs the same key", noBacktrack, entries("p_q=1"), ""},

		// Several limits, unlimited, shadow.
		{"several limits", mustParseFile(t, "extensions.yaml"), entries("user=u1"), "user#0,user#1"},
		{"nested gcra", mustParseFile(t, "extensions.yaml"), entries("user=u1", "path=/x"), "user/path#0"},
		{"unlimited", mustParseFile(t, "ratelimit_shadow_unlimited.yaml"), entries("ldap=cn"), "ldap#0"},
		{"shadow", mustParseFile(t, "ratelimit_shadow_unlimited.yaml"), entries("key=value", "subkey=subvalue"), "key=value/subkey=subvalue#0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ids(tt.domain.Match(tt.request)); got != tt.want {
				t.Errorf("Match(%v) = %q, want %q", tt.request, got, tt.want)
			}
		})
	}
}

func TestMatchFlags(t *testing.T) {
	s := mustParseFile(t, "ratelimit_shadow_unlimited.yaml")
	if ls := s.Match(entries("ldap=x")); len(ls) != 1 || !ls[0].Unlimited || ls[0].Params(1) != nil {
		t.Errorf("ldap: %+v", ls)
	}
	if ls := s.Match(entries("key=value", "subkey=subvalue")); len(ls) != 1 || !ls[0].ShadowMode || ls[0].Unlimited {
		t.Errorf("shadow: %+v", ls)
	}
	if ls := s.Match(entries("azure=x")); len(ls) != 1 || ls[0].ShadowMode {
		t.Errorf("azure: %+v", ls)
	}
}

func TestDropReplaced(t *testing.T) {
	d := mustParseFile(t, "ratelimit_replaces.yaml")
	tests := []struct {
		name    string
		request [][]Entry
		want    []string
	}{
		{"replaced across descriptors", [][]Entry{entries("remote_address=1.2.3.4"), entries("api_key=trusted")},
			[]string{"", "api_key=trusted#0"}},
		{"order does not matter", [][]Entry{entries("api_key=trusted"), entries("remote_address=1.2.3.4")},
			[]string{"api_key=trusted#0", ""}},
		{"no replacer matched", [][]Entry{entries("remote_address=1.2.3.4"), entries("api_key=other")},
			[]string{"remote_address#0", "api_key#0"}},
		{"unlimited replaces too", [][]Entry{entries("remote_address=1"), entries("api_key=other"), entries("internal=yes")},
			[]string{"", "", "internal#0"}},
		{"replacer alone", [][]Entry{entries("api_key=trusted")}, []string{"api_key=trusted#0"}},
		{"unmatched descriptor", [][]Entry{entries("nothing=1"), entries("remote_address=1")}, []string{"", "remote_address#0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			matched := make([][]*Limit, len(tt.request))
			for i, e := range tt.request {
				matched[i] = d.Match(e)
			}
			matched = d.DropReplaced(matched)
			for i, ls := range matched {
				if got := ids(ls); got != tt.want[i] {
					t.Errorf("descriptor %d: %q, want %q", i, got, tt.want[i])
				}
			}
		})
	}
	// The shared slices Match returns are never modified.
	if got := ids(d.Match(entries("remote_address=1"))); got != "remote_address#0" {
		t.Errorf("Match result changed: %q", got)
	}
}

func TestDropReplacedPartial(t *testing.T) {
	d := mustParse(t, `
domain: p
descriptors:
  - key: user
    rate_limits:
      - {name: short, unit: second, requests_per_unit: 5}
      - {name: long, unit: day, requests_per_unit: 500}
  - key: vip
    rate_limit:
      unit: second
      requests_per_unit: 50
      replaces: [{name: short}]
`)
	shared := d.Match(entries("user=u"))
	matched := d.DropReplaced([][]*Limit{shared, d.Match(entries("vip=v"))})
	if got := ids(matched[0]); got != "user#1" {
		t.Errorf("kept %q, want user#1", got)
	}
	if got := ids(shared); got != "user#0,user#1" {
		t.Errorf("shared slice modified: %q", got)
	}
}

// TestDropReplacedManyNames exercises more replaced names than fit in the
// on-stack bit set.
func TestDropReplacedManyNames(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: many\ndescriptors:\n")
	const n = 300
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "  - key: k%d\n    rate_limit: {name: n%d, unit: second, requests_per_unit: 1}\n", i, i)
		fmt.Fprintf(&b, "  - key: r%d\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: n%d}]}\n", i, i)
	}
	d := mustParse(t, b.String())
	matched := [][]*Limit{d.Match(entries("k5=x")), d.Match(entries("k299=x")), d.Match(entries("r299=x")), d.Match(entries("k7=x"))}
	matched = d.DropReplaced(matched)
	got := []string{ids(matched[0]), ids(matched[1]), ids(matched[2]), ids(matched[3])}
	want := []string{"k5#0", "", "r299#0", "k7#0"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestMatchAllocations(t *testing.T) {
	d := mustParseFile(t, "ratelimit_wildcard.yaml")
	req := entries("path=/api/v1/users", "method=POST")
	if n := testing.AllocsPerRun(100, func() { d.Match(req) }); n != 0 {
		t.Errorf("Match allocates %v times", n)
	}
	r := mustParseFile(t, "ratelimit_replaces.yaml")
	matched := [][]*Limit{r.Match(entries("remote_address=1")), r.Match(entries("api_key=x"))}
	if n := testing.AllocsPerRun(100, func() { r.DropReplaced(matched) }); n != 0 {
		t.Errorf("DropReplaced with nothing replaced allocates %v times", n)
	}
}

func BenchmarkMatch(b *testing.B) {
	d := mustParseFile(b, "ratelimit_basic.yaml")
	w := mustParseFile(b, "ratelimit_wildcard.yaml")
	for _, bc := range []struct {
		name string
		d    *Domain
		req  []Entry
	}{
		{"exact_2levels", d, entries("tenant=acme", "user=root")},
		{"keyonly_1level", d, entries("client=10.0.0.1")},
		{"wildcard_2levels", w, entries("path=/api/v1/users", "method=POST")},
		{"miss", d, entries("nothing=here")},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				bc.d.Match(bc.req)
			}
		})
	}
}
