package policy

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// FuzzParse checks that Parse never panics, that every failure is an
// ErrorList of errors that each name the file, that everything it accepts
// survives Marshal and Parse unchanged and validates in both time units, and
// that Match on the accepted policy never panics.
func FuzzParse(f *testing.F) {
	seeds, _ := filepath.Glob("testdata/*.yaml")
	seeds = append(seeds, "example.yaml")
	for _, s := range seeds {
		if data, err := os.ReadFile(s); err == nil {
			f.Add(data)
		}
	}
	for _, s := range []string{
		"", "domain: d", "domain: d\ndescriptors: [{key: k, value: 'a*', rate_limit: {unit: second, requests_per_unit: 1}}]",
		"domain: d\ndescriptors:\n- &a {key: k}\n- *a\n", "domain: [\n", "---\n---\n", "domain: d\n<<: {a: b}\n",
		"domain: d\ndescriptors: [{key: k, rate_limits: [{window: 1us, requests_per_unit: 1, algorithm: gcra}]}]",
		"domain: d\ndescriptors: [{key: k, rate_limit: {unlimited: yes, replaces: [{name: x}]}}]",
		cyclicDoc, deepDoc(70), "domain: d\ndescriptors: [{key: k, value: a*, share_threshold: true, descriptors: [{key: u, rate_limit: {unit: second, requests_per_unit: 1}}]}]",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := Parse("fuzz.yaml", data)
		if err != nil {
			if d != nil {
				t.Fatal("domain returned with an error")
			}
			var list ErrorList
			if !errors.As(err, &list) || len(list) == 0 {
				t.Fatalf("error %T %v", err, err)
			}
			for _, e := range list {
				if !strings.HasPrefix(e.Error(), "fuzz.yaml") {
					t.Fatalf("error without file: %q", e.Error())
				}
			}
			return
		}
		for _, l := range d.Limits() {
			if l.Requests == 0 && !l.Unlimited {
				continue // refuses everything: nothing to validate
			}
			for _, u := range []time.Duration{time.Nanosecond, time.Microsecond} {
				if err := l.validate(u); err != nil {
					t.Fatalf("accepted limit %s fails validation in %v: %v", l.ID, u, err)
				}
			}
		}
		out, err := Marshal(d)
		if err != nil {
			t.Fatalf("Marshal: %v", err)
		}
		back, err := Parse("fuzz.yaml", out)
		if err != nil {
			t.Fatalf("re-parse of Marshal output: %v\n%s", err, out)
		}
		if !d.Equal(back) {
			t.Fatalf("round trip changed the policy:\n%s", out)
		}
		// Match every configured path, and a mangled one.
		var walk func(prefix []Entry, ds []*Descriptor)
		walk = func(prefix []Entry, ds []*Descriptor) {
			for _, x := range ds {
				req := append(append([]Entry(nil), prefix...), Entry{x.Key, strings.TrimSuffix(x.Value, "*") + "z"})
				d.DropReplaced([][]*Limit{d.Match(req), d.Match(req[:len(req)-1])})
				walk(req, x.Descriptors)
			}
		}
		walk(nil, d.Descriptors)
	})
}
