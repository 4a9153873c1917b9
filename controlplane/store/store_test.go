package store

import (
	"strings"
	"testing"
)

func TestKeyDistinct(t *testing.T) {
	long := strings.Repeat("x", 64<<10)
	cases := []struct {
		domain string
		e      []Entry
		id     string
		alg    Algorithm
	}{
		{"d", []Entry{{"a", "b"}}, "l", FixedWindow},
		{"d", []Entry{{"a", "b"}}, "l", SlidingLog},   // algorithm differs
		{"d", []Entry{{"a", "b"}}, "l2", FixedWindow}, // limit differs
		{"d", []Entry{{"a:b", ""}}, "l", FixedWindow}, // separator inside a value
		{"d", []Entry{{"a", ":b"}}, "l", FixedWindow},
		{"d", []Entry{{"a", "b"}, {"c", "d"}}, "l", FixedWindow},
		{"d", []Entry{{"a", "b\x00c"}, {"d", ""}}, "l", FixedWindow},
		{"d", []Entry{{"a", "b"}, {"c", ""}}, "l", FixedWindow},
		{"d", []Entry{{"a", "{b}"}}, "l", FixedWindow},
		{"d", []Entry{{"a", "b\n"}}, "l", FixedWindow},
		{"d", []Entry{{"a", long}}, "l", FixedWindow},
		{"d", []Entry{{"a", long + "y"}}, "l", FixedWindow},
		{"da", []Entry{{"", "b"}}, "l", FixedWindow},
		{"d", []Entry{{"ab", ""}}, "l", FixedWindow},
		{"d", nil, "l", FixedWindow},
		{"", []Entry{{"d", ""}}, "l", FixedWindow},
	}
	seen := map[string]int{}
	for i, c := range cases {
		k := Key(c.domain, c.e, c.id, c.alg)
		if j, dup := seen[k]; dup {
			t.Fatalf("cases %d and %d share key %q", j, i, k)
		}
		seen[k] = i
		if !strings.HasPrefix(k, KeyPrefix+"{") || !strings.HasSuffix(k, "}") || len(k) != len(KeyPrefix)+34 {
			t.Fatalf("key %q is not prefix+{32 hex}", k)
		}
		if k != Key(c.domain, c.e, c.id, c.alg) {
			t.Fatal("Key is not deterministic")
		}
	}
}
