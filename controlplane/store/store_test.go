package store

import (
	"math/rand"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/algorithms"
)

func TestKeyDistinct(t *testing.T) {
	long := strings.Repeat("x", 64<<10)
	cases := []struct {
		domain string
		e      []Entry
		id     string
		alg    algorithms.Kind
	}{
		{"d", []Entry{{"a", "b"}}, "l", algorithms.KindFixedWindow},
		{"d", []Entry{{"a", "b"}}, "l", algorithms.KindSlidingLog},   // algorithm differs
		{"d", []Entry{{"a", "b"}}, "l2", algorithms.KindFixedWindow}, // limit differs
		{"d", []Entry{{"a:b", ""}}, "l", algorithms.KindFixedWindow}, // separator inside a value
		{"d", []Entry{{"a", ":b"}}, "l", algorithms.KindFixedWindow},
		{"d", []Entry{{"a", "b"}, {"c", "d"}}, "l", algorithms.KindFixedWindow},
		{"d", []Entry{{"a", "b\x00c"}, {"d", ""}}, "l", algorithms.KindFixedWindow},
		{"d", []Entry{{"a", "b"}, {"c", ""}}, "l", algorithms.KindFixedWindow},
		{"d", []Entry{{"a", "{b}"}}, "l", algorithms.KindFixedWindow},
		{"d", []Entry{{"a", "b\n"}}, "l", algorithms.KindFixedWindow},
		{"d", []Entry{{"a", "b%7C"}}, "l", algorithms.KindFixedWindow}, // an escape spelled out
		{"d", []Entry{{"a", "b|"}}, "l", algorithms.KindFixedWindow},
		{"d", []Entry{{"a", "b"}}, "|l", algorithms.KindFixedWindow},
		{"d|a", []Entry{{"b", ""}}, "l", algorithms.KindFixedWindow},
		{"d", []Entry{{"a", long}}, "l", algorithms.KindFixedWindow},
		{"d", []Entry{{"a", long + "y"}}, "l", algorithms.KindFixedWindow},
		{"d", []Entry{{"a", strings.Repeat("%", 40)}}, "l", algorithms.KindFixedWindow}, // 120 bytes escaped: hashed
		{"d", []Entry{{"a", strings.Repeat("%", 39)}}, "l", algorithms.KindFixedWindow},
		{"da", []Entry{{"", "b"}}, "l", algorithms.KindFixedWindow},
		{"d", []Entry{{"ab", ""}}, "l", algorithms.KindFixedWindow},
		{"d", nil, "l", algorithms.KindFixedWindow},
		{"", []Entry{{"d", ""}}, "l", algorithms.KindFixedWindow},
		{"~", nil, "", algorithms.KindFixedWindow},
	}
	seen := map[string]int{}
	for i, c := range cases {
		k := Key(c.domain, c.e, c.id, c.alg)
		if j, dup := seen[k]; dup {
			t.Fatalf("cases %d and %d share key %q", j, i, k)
		}
		seen[k] = i
		if !strings.HasPrefix(k, KeyPrefix+"{") || !strings.HasSuffix(k, "}") || len(k) > maxDirectKey+10 {
			t.Fatalf("key %q is not prefix{...} of at most %d bytes", k, maxDirectKey+10)
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
		alg    algorithms.Kind
		want   string
	}{
		{"d", []Entry{{"a", "b"}, {"c", ""}}, "l#0", algorithms.KindFixedWindow, "sluice:{d:a=b:c=|l#0|fw}"},
		{"bench", []Entry{{"user", "k1"}}, "user#0", algorithms.KindGCRA, "sluice:{bench:user=k1|user#0|gcra}"},
		{"", nil, "", algorithms.KindSlidingLog, "sluice:{||sl}"},
		{"api", []Entry{{"path", "/v1/{id}"}, {"remote_address", "10.0.0.1"}}, "path=%2Fv1/remote_address#1", algorithms.KindSlidingWindow,
			"sluice:{api:path=/v1/%7Bid%7D:remote_address=10.0.0.1|path%3D%252Fv1/remote_address#1|sw}"},
		{"d", []Entry{{"a", strings.Repeat("x", 300)}}, "l", algorithms.KindTokenBucket,
			"sluice:{~9ed1aaf54eda7fdce50f524a4f14a8881f7c91465444d8f2e5e949cc09a2eb37}"},
	} {
		if got := Key(c.domain, c.e, c.id, c.alg); got != c.want {
			t.Errorf("Key(%q, %d entries, %q, %v) = %s, want %s", c.domain, len(c.e), c.id, c.alg, got, c.want)
		}
	}
}

// identity is what Key encodes.
type identity struct {
	domain  string
	entries []Entry
	id      string
	alg     string
}

// parseKey reads a spelled-out key back (ok false for a hashed one): if it
// returns every identity Key was given, no two identities can share a key.
func parseKey(t *testing.T, k string) (identity, bool) {
	t.Helper()
	body, ok := strings.CutPrefix(k, KeyPrefix+"{")
	if !ok || !strings.HasSuffix(body, "}") {
		t.Fatalf("key %q: no prefix or braces", k)
	}
	body = body[:len(body)-1]
	if strings.HasPrefix(body, "~") {
		return identity{}, false
	}
	unescape := func(s string) string {
		var b []byte
		for i := 0; i < len(s); i++ {
			switch c := s[i]; {
			case c == '%':
				if i+3 > len(s) {
					t.Fatalf("key %q: cut escape", k)
				}
				n, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
				if err != nil {
					t.Fatalf("key %q: bad escape %q", k, s[i:i+3])
				}
				b = append(b, byte(n))
				i += 2
			case strings.IndexByte(":=|{}~%", c) >= 0:
				t.Fatalf("key %q: %q not escaped", k, c)
			default:
				b = append(b, c)
			}
		}
		return string(b)
	}
	parts := strings.Split(body, "|")
	if len(parts) != 3 {
		t.Fatalf("key %q: %d parts", k, len(parts))
	}
	head := strings.Split(parts[0], ":")
	id := identity{domain: unescape(head[0]), id: unescape(parts[1]), alg: parts[2]}
	for _, e := range head[1:] {
		kv := strings.Split(e, "=")
		if len(kv) != 2 {
			t.Fatalf("key %q: entry %q", k, e)
		}
		id.entries = append(id.entries, Entry{unescape(kv[0]), unescape(kv[1])})
	}
	return id, true
}

// TestKeyInjective: random identities, of hostile bytes and of every
// length around the limit, read back from their spelled-out keys; the
// hashed ones are exactly those too long to spell out.
func TestKeyInjective(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	alphabet := "ab:=|{}%~\x00\n/#" + "\xff"
	str := func() string {
		b := make([]byte, rng.Intn(24))
		for i := range b {
			b[i] = alphabet[rng.Intn(len(alphabet))]
		}
		return string(b)
	}
	var spelled, hashed int
	for range 20000 {
		in := identity{domain: str(), id: str(), alg: kindCode(algorithms.KindFixedWindow)}
		for range rng.Intn(4) {
			in.entries = append(in.entries, Entry{str(), str()})
		}
		k := Key(in.domain, in.entries, in.id, algorithms.KindFixedWindow)
		got, ok := parseKey(t, k)
		if !ok {
			hashed++
			if len(k) != len(KeyPrefix)+3+64 {
				t.Fatalf("hashed key %q", k)
			}
			continue
		}
		spelled++
		if len(k) > maxDirectKey {
			t.Fatalf("key of %d bytes spelled out: %q", len(k), k)
		}
		if !reflect.DeepEqual(got, in) {
			t.Fatalf("key %q reads back as %+v, want %+v", k, got, in)
		}
	}
	if spelled < 1000 || hashed < 1000 {
		t.Fatalf("%d spelled out, %d hashed: both forms need exercising", spelled, hashed)
	}
}

// FuzzKey: any identity's spelled-out key reads back to it.
func FuzzKey(f *testing.F) {
	f.Add("api", "user", "alice", "user#0")
	f.Add("d|a", "b:=", "%7C", "|")
	f.Fuzz(func(t *testing.T, domain, key, value, id string) {
		in := identity{domain: domain, entries: []Entry{{key, value}}, id: id, alg: kindCode(algorithms.KindGCRA)}
		k := Key(domain, in.entries, id, algorithms.KindGCRA)
		if got, ok := parseKey(t, k); ok && !reflect.DeepEqual(got, in) {
			t.Fatalf("key %q reads back as %+v, want %+v", k, got, in)
		}
	})
}

// TestKeyAllocs: a key of a small identity costs one allocation (the string).
func TestKeyAllocs(t *testing.T) {
	e := []Entry{{"user", "alice"}}
	if n := testing.AllocsPerRun(100, func() { Key("domain", e, "user#0", algorithms.KindFixedWindow) }); n > 1 {
		t.Errorf("Key allocates %v times, want 1", n)
	}
}
