package jsonscan

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/filter/core/llm/internal/jsontest"
)

// testSchema wants a little of everything:
//
//	{"n": int 0, "b": bool 0, "s": measured 0, "c": capture 0 (8 bytes),
//	 "raw": raw 1, "f": flag 0, "o": {"n": int 1}, "a": [ {"n": int 2} ],
//	 "rec": recursive: strings measured 2, arrays and "k" members recurse}
func testSchema() *Schema {
	s := NewSchema()
	s.Capture(0, 8)
	root, rec := s.New(), s.New()
	s.Set(rec, Def{Measure: At(2), Array: true, Elem: rec, Members: []Member{{"k", rec}}})
	s.Set(root, Def{Members: []Member{
		{"n", s.Add(Def{Int: At(0)})},
		{"b", s.Add(Def{Bool: At(0)})},
		{"s", s.Add(Def{Measure: At(0)})},
		{"c", s.Add(Def{Capture: At(0)})},
		{"raw", s.Add(Def{Raw: At(1)})},
		{"f", s.Add(Def{Flag: At(0)})},
		{"o", s.Add(Def{Members: []Member{{"n", s.Add(Def{Int: At(1)})}}})},
		{"a", s.Add(Def{Array: true, Elem: s.Add(Def{Members: []Member{{"n", s.Add(Def{Int: At(2)})}}})})},
		{"rec", rec},
	}})
	return s
}

var schema = testSchema()

// scan scans doc in pieces of size n (0: whole).
func scan(doc string, n int) *Scanner {
	s := NewScanner(schema)
	b := []byte(doc)
	if n <= 0 {
		n = len(b) + 1
	}
	for len(b) > 0 {
		k := min(n, len(b))
		s.Write(b[:k])
		b = b[k:]
	}
	return s
}

func TestValues(t *testing.T) {
	doc := `{"x":[1,{"n":5}],"n":42,"b":true,"s":"h\u00e9\n\ud83d\ude00!","c":"abc\u00e9",` +
		`"raw":{"a":[1,2]},"f":{},"o":{"n":7,"z":"q"},"a":[{"n":1},{"n":2}],"rec":["ab",{"k":"cd","j":"zz"}]}`
	for _, n := range []int{0, 1, 2, 3, 7} {
		s := scan(doc, n)
		if !s.Complete() {
			t.Fatalf("pieces of %d: not complete (error at %d)", n, s.ErrorOffset())
		}
		check := func(what string, got, want any) {
			t.Helper()
			if got != want {
				t.Errorf("pieces of %d: %s = %v, want %v", n, what, got, want)
			}
		}
		v, set, bad := s.Values().Int(0)
		check("n", [3]any{v, set, bad}, [3]any{int64(42), true, false})
		v, _, _ = s.Values().Int(1)
		check("o.n", v, int64(7))
		v, _, _ = s.Values().Int(2)
		check("a[].n (last)", v, int64(2))
		b, set := s.Values().Bool(0)
		check("b", [2]bool{b, set}, [2]bool{true, true})
		// h (1) é (2) \n (1) 😀 (4, a surrogate pair) ! (1)
		check("s measured", s.Values().Counter(0), int64(9))
		c, over := s.Captured(0)
		check("c captured", string(c), "abc\u00e9")
		check("c over", over, false)
		check("raw", s.Values().Counter(1), int64(len(`{"a":[1,2]}`)))
		check("flag", s.Values().Flag(0), true)
		check("rec", s.Values().Counter(2), int64(4))
	}
}

func TestIntSlots(t *testing.T) {
	for _, tc := range []struct {
		doc      string
		v        int64
		set, bad bool
	}{
		{`{"n":0}`, 0, true, false},
		{`{"n":9007199254740991}`, 9007199254740991, true, false},
		{`{"n":9007199254740992}`, 0, false, true},
		{`{"n":99999999999999999999999}`, 0, false, true},
		{`{"n":-1}`, 0, false, true},
		{`{"n":1.0}`, 0, false, true},
		{`{"n":1e3}`, 0, false, true},
		{`{"n":"12"}`, 0, false, true},
		{`{"n":true}`, 0, false, true},
		{`{"n":{"x":1}}`, 0, false, true},
		{`{"n":[1]}`, 0, false, true},
		{`{"n":null}`, 0, false, false},
		{`{"n":-1,"n":3}`, 3, true, false},
		{`{"n":3,"n":"x"}`, 3, false, true},
	} {
		v, set, bad := scan(tc.doc, 0).Values().Int(0)
		if set != tc.set || bad != tc.bad || set && v != tc.v {
			t.Errorf("%s: Int = %d, %v, %v; want %d, %v, %v", tc.doc, v, set, bad, tc.v, tc.set, tc.bad)
		}
	}
}

func TestCaptureBound(t *testing.T) {
	s := scan(`{"c":"0123456789"}`, 3)
	c, over := s.Captured(0)
	if string(c) != "01234567" || !over {
		t.Errorf("Captured = %q, %v; want the first 8 bytes and over", c, over)
	}
	s = scan(`{"c":"\ud800x"}`, 1) // a lone high surrogate
	if c, _ := s.Captured(0); string(c) != "\ufffdx" {
		t.Errorf("lone surrogate captured as %q", c)
	}
}

func TestLongKeysMatchNothing(t *testing.T) {
	long := strings.Repeat("n", MaxKey+1)
	s := scan(`{"`+long+`":1,"\u006e":2}`, 5) // "\u006e" is "n"
	if v, set, _ := s.Values().Int(0); !set || v != 2 {
		t.Errorf("Int = %d, %v; want the escaped key to match and the long one not", v, set)
	}
}

func TestDepth(t *testing.T) {
	ok := `{"x":` + strings.Repeat("[", MaxDepth-1) + strings.Repeat("]", MaxDepth-1) + `}`
	if s := scan(ok, 0); !s.Complete() {
		t.Errorf("depth %d: not complete", MaxDepth)
	}
	deep := `{"x":` + strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth) + `}`
	if s := scan(deep, 0); !s.Failed() {
		t.Errorf("depth %d: not failed", MaxDepth+1)
	}
}

// TestGrammar compares validity with encoding/json on documents that
// probe each rule, whole and byte by byte.
func TestGrammar(t *testing.T) {
	for _, doc := range []string{
		`{}`, ` { } `, `{"a":1}`, `{"a":[]}`, `{"a":[1,2,3]}`, `{"a":{"b":{"c":null}}}`,
		`{"a":-0}`, `{"a":-0.5e-7}`, `{"a":1E+2}`, `{"a":01}`, `{"a":-}`, `{"a":1.}`, `{"a":.5}`,
		`{"a":1e}`, `{"a":1e+}`, `{"a":+1}`, `{"a":tru}`, `{"a":truex}`, `{"a":nul}`, `{"a":falsey}`,
		`{"a":"\x01"}`, `{"a":"\q"}`, `{"a":"\u12"}`, `{"a":"\u12G4"}`, `{"a":"\/\b\f\n\r\t"}`,
		`{"a":1,}`, `{"a":[1,]}`, `{,}`, `{"a" 1}`, `{"a":1 "b":2}`, `{"a":[1}`, `{"a":{]}`,
		`{} {}`, `{}x`, `[]`, `"s"`, `1`, ``, `   `, `{"a":"\ud800"}`, "{\"a\":\"\xff\"}",
		`{"a":1}}`, `{"a":[[[]]]}`, `{1:2}`, `{"a"}`, `{"a":}`,
	} {
		want := json.Valid([]byte(doc)) && strings.HasPrefix(strings.TrimSpace(doc), "{")
		for _, n := range []int{0, 1} {
			s := scan(doc, n)
			if s.Complete() != want {
				t.Errorf("%q in pieces of %d: Complete = %v, encoding/json says %v", doc, n, s.Complete(), want)
			}
			if want == s.Failed() && doc != "" && strings.TrimSpace(doc) != "" && !isTruncated(doc) {
				t.Errorf("%q: Failed = %v", doc, s.Failed())
			}
		}
	}
}

// isTruncated reports whether doc is a valid document's beginning.
func isTruncated(doc string) bool {
	d := json.NewDecoder(strings.NewReader(doc))
	for {
		_, err := d.Token()
		if err != nil {
			return err.Error() == "unexpected EOF" || err.Error() == "EOF"
		}
	}
}

func TestReset(t *testing.T) {
	s := scan(`{"n":1,"b":true,"s":"abc","c":"x","f":1}`, 0)
	s.Reset()
	s.Write([]byte(`{"o":{}}`))
	if !s.Complete() || s.Values().IntsSeen(1) || s.Values().Counter(0) != 0 || s.Values().Flag(0) {
		t.Error("Reset left values of the first document")
	}
	if _, set := s.Values().Bool(0); set {
		t.Error("Reset left a boolean")
	}
	if c, _ := s.Captured(0); len(c) != 0 {
		t.Error("Reset left a capture")
	}
}

func TestPlain(t *testing.T) {
	for n := 0; n <= 20; n++ {
		for at := 0; at <= n; at++ {
			for _, c := range []byte{'"', '\\', 0, 0x1f, '\n'} {
				b := bytes.Repeat([]byte{'a'}, n)
				want := n
				if at < n {
					b[at], want = c, at
				}
				b = append(b, 0xff, 0x80) // never special
				if got := plain(b[:n]); got != want {
					t.Errorf("plain of %d bytes, %q at %d: %d", n, c, at, got)
				}
			}
		}
	}
	if got := plain([]byte("ab\x01\x01\"cd")); got != 2 {
		t.Errorf("plain with a borrow after the first mark: %d", got)
	}
	if got := plain([]byte("\xff\x80 ~\x7fabc\x1f")); got != 8 {
		t.Errorf("plain of high bytes: %d", got)
	}
}

func TestWriteAllocatesNothing(t *testing.T) {
	doc := []byte(`{"n":42,"s":"h\u00e9llo","c":"abc\u00e9","raw":{"a":[1,2]},"a":[{"n":1}],"x":[true,false,null,1.5e3]}`)
	s := NewScanner(schema)
	if n := testing.AllocsPerRun(100, func() {
		s.Reset()
		for i := range doc {
			s.Write(doc[i : i+1])
		}
	}); n != 0 {
		t.Errorf("Write allocates %v times per document", n)
	}
}

func FuzzScanner(f *testing.F) {
	for _, doc := range []string{`{"n":42,"s":"x","rec":[{"k":"ab"}]}`, `{"a":[1,{"b":null}],"c":-0.5e3}`, `{"s":"\ud83d\ude00\u00e9"}`} {
		f.Add([]byte(doc), uint8(3))
	}
	f.Fuzz(func(t *testing.T, doc []byte, cut uint8) {
		whole := NewScanner(schema)
		whole.Write(doc)
		want := jsontest.ValidObject(doc, MaxDepth)
		if whole.Complete() != want {
			t.Fatalf("Complete = %v, encoding/json says %v: %q", whole.Complete(), want, doc)
		}
		parts := NewScanner(schema)
		k := min(int(cut), len(doc))
		parts.Write(doc[:k])
		parts.Write(doc[k:])
		if parts.Complete() != whole.Complete() || parts.Failed() != whole.Failed() || parts.vals.ints != whole.vals.ints || parts.vals.intSet != whole.vals.intSet || parts.vals.intBad != whole.vals.intBad ||
			parts.vals.counters != whole.vals.counters || parts.vals.flags != whole.vals.flags || parts.vals.bools != whole.vals.bools {
			t.Fatalf("cut at %d gives another result: %q", k, doc)
		}
		c1, o1 := whole.Captured(0)
		c2, o2 := parts.Captured(0)
		if !bytes.Equal(c1, c2) || o1 != o2 {
			t.Fatalf("cut at %d gives another capture: %q", k, doc)
		}
	})
}

// TestMemo: a Scanner helped by a Memo ends every document of a sequence
// in the state a fresh one reaches, whatever the documents share, however
// they are cut.
func TestMemo(t *testing.T) {
	base := `{"n":1,"b":true,"c":"abcdefgh","o":{"n":2},"s":"hello","a":[{"n":3}],"rec":[{"k":"xy"}],"raw":[1,2],"f":null}`
	rng := rand.New(rand.NewPCG(5, 6))
	var m Memo
	memo := NewScanner(schema)
	for i := 0; i < 3000; i++ {
		doc := []byte(base)
		for k := rng.IntN(3); k > 0; k-- { // change a byte or two, often late
			at := len(doc) - 1 - rng.IntN(len(doc))/(1+rng.IntN(4))
			doc[at] = "ab\"1:,{}[] x"[rng.IntN(12)]
		}
		if rng.IntN(10) == 0 {
			doc = append(doc, strings.Repeat("z", rng.IntN(2*MemoBytes))...)
		}
		fresh := NewScanner(schema)
		fresh.Write(doc)
		memo.Reset()
		m.Begin()
		for rest := doc; len(rest) > 0; {
			n := min(len(rest), 1+rng.IntN(len(doc)))
			if got := m.Line(memo, rest[:n]); got != n {
				t.Fatalf("Line took %d of %d bytes", got, n)
			}
			rest = rest[n:]
			if rng.IntN(4) == 0 {
				m.Flush(memo)
			}
		}
		m.End(memo, false)
		if !sameResults(memo, fresh) {
			t.Fatalf("document %d: %q: the memo changed the result", i, doc)
		}
	}
}

// sameResults compares what two Scanners found.
func sameResults(a, b *Scanner) bool {
	ca, oa := a.Captured(0)
	cb, ob := b.Captured(0)
	return a.Complete() == b.Complete() && a.Failed() == b.Failed() && a.vals.intSet == b.vals.intSet && a.vals.intBad == b.vals.intBad &&
		a.vals.counters == b.vals.counters && a.vals.flags == b.vals.flags && a.vals.boolSet == b.vals.boolSet && a.vals.bools&a.vals.boolSet == b.vals.bools&b.vals.boolSet &&
		bytes.Equal(ca, cb) && oa == ob && intsEqual(a, b)
}

func intsEqual(a, b *Scanner) bool {
	for k := 0; k < MaxInts; k++ {
		if a.vals.intSet&(1<<k) != 0 && a.vals.ints[k] != b.vals.ints[k] {
			return false
		}
	}
	return true
}
