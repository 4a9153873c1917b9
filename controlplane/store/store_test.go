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

// TestKeyStable pins Key's output: keys name state already in Redis, so a
// change of encoding would silently reset every limit.
func TestKeyStable(t *testing.T) {
	for _, c := range []struct {
		domain string
		e      []Entry
		id     string
		alg    Algorithm
		want   string
	}{
		{"d", []Entry{{"a", "b"}, {"c", ""}}, "l#0", FixedWindow, "sluice:{bc992569b9fa2f00d77ace3cd4d537e5}"},
		{"bench", []Entry{{"user", "k1"}}, "user#0", GCRA, "sluice:{04e95961c820c886749d331ef93fa9d7}"},
		{"", nil, "", SlidingLog, "sluice:{f49456fde9c54ee968b25b92e0f70ba7}"},
		{"d", []Entry{{"a", strings.Repeat("x", 300)}}, "l", TokenBucket, "sluice:{516545fafff4c9324b89896569eccb13}"},
	} {
		if got := Key(c.domain, c.e, c.id, c.alg); got != c.want {
			t.Errorf("Key(%q, %d entries, %q, %v) = %s, want %s", c.domain, len(c.e), c.id, c.alg, got, c.want)
		}
	}
}

// TestKeyAllocs: a key of a small identity costs one allocation (the string).
func TestKeyAllocs(t *testing.T) {
	e := []Entry{{"user", "alice"}}
	if n := testing.AllocsPerRun(100, func() { Key("domain", e, "user#0", FixedWindow) }); n > 1 {
		t.Errorf("Key allocates %v times, want 1", n)
	}
}
