package host

import (
	"bytes"
	"errors"
	"testing"
)

func TestEncodePairsMatchesSpecExample(t *testing.T) {
	// The specification's example map {"a": "1", "b": "22"}.
	want := []byte{
		2, 0, 0, 0,
		1, 0, 0, 0, 1, 0, 0, 0,
		1, 0, 0, 0, 2, 0, 0, 0,
		'a', 0, '1', 0, 'b', 0, '2', '2', 0,
	}
	got := EncodePairs(Headers{{"a", "1"}, {"b", "22"}})
	if !bytes.Equal(got, want) {
		t.Fatalf("EncodePairs = %v, want %v", got, want)
	}
	if PairsSize(Headers{{"a", "1"}, {"b", "22"}}) != len(want) {
		t.Fatalf("PairsSize = %d, want %d", PairsSize(Headers{{"a", "1"}, {"b", "22"}}), len(want))
	}
}

func TestPairsRoundTrip(t *testing.T) {
	for _, h := range []Headers{
		{{":path", "/"}, {"x", ""}, {"", "v"}, {"k", "v1"}, {"k", "v2"}},
		{{"empty", ""}},
		{{"binary", "a\x00b"}},
	} {
		got, err := DecodePairs(EncodePairs(h))
		if err != nil {
			t.Fatalf("DecodePairs(EncodePairs(%q)): %v", h, err)
		}
		if len(got) != len(h) {
			t.Fatalf("round trip of %q = %q", h, got)
		}
		for i := range h {
			if got[i] != h[i] {
				t.Fatalf("round trip of %q = %q", h, got)
			}
		}
	}
}

func TestDecodePairs(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      []byte
		want    int
		wantErr bool
	}{
		{"nil is empty", nil, 0, false},
		{"single zero byte is empty (spec)", []byte{0}, 0, false},
		{"zero count", []byte{0, 0, 0, 0}, 0, false},
		{"short garbage", []byte{1, 2}, 0, true},
		{"count larger than input", []byte{9, 0, 0, 0, 1, 0, 0, 0}, 0, true},
		{"huge count", []byte{0xff, 0xff, 0xff, 0xff}, 0, true},
		{"lengths past the end", []byte{1, 0, 0, 0, 5, 0, 0, 0, 5, 0, 0, 0, 'a', 0}, 0, true},
		{"missing final terminator", []byte{1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 'a', 0, 'b'}, 0, true},
		{"one pair", []byte{1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 'a', 0, 'b', 0}, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodePairs(tc.in)
			if (err != nil) != tc.wantErr {
				t.Fatalf("DecodePairs(%v) error = %v, want error %v", tc.in, err, tc.wantErr)
			}
			if err != nil && !errors.Is(err, errMalformedPairs) {
				t.Fatalf("error %v does not wrap errMalformedPairs", err)
			}
			if len(got) != tc.want {
				t.Fatalf("DecodePairs(%v) = %q, want %d pairs", tc.in, got, tc.want)
			}
		})
	}
}

func TestHeadersEdits(t *testing.T) {
	h := Headers{{"a", "1"}, {"b", "2"}, {"a", "3"}}
	h.replace("A", "x")
	if got := h.Values("a"); len(got) != 1 || got[0] != "x" || h[0][0] != "a" {
		t.Fatalf("replace kept %q", h)
	}
	h.replace("c", "new")
	if v, _ := h.Get("c"); v != "new" {
		t.Fatalf("replace of a missing key: %q", h)
	}
	h.add("B", "4")
	if got := h.Values("b"); len(got) != 2 {
		t.Fatalf("add: %q", h)
	}
	h.remove("b")
	if _, ok := h.Get("b"); ok {
		t.Fatalf("remove: %q", h)
	}
}

func TestLocalReplyHeaders(t *testing.T) {
	h := LocalReplyHeaders(&LocalResponse{Status: 429, Body: []byte("slow down"), Headers: Headers{{"retry-after", "3"}}})
	want := Headers{{":status", "429"}, {"retry-after", "3"}, {"content-length", "9"}, {"content-type", "text/plain"}}
	if len(h) != len(want) {
		t.Fatalf("LocalReplyHeaders = %q, want %q", h, want)
	}
	for i := range want {
		if h[i] != want[i] {
			t.Fatalf("LocalReplyHeaders = %q, want %q", h, want)
		}
	}
	h = LocalReplyHeaders(&LocalResponse{Status: 200, Body: []byte("{}"), Headers: Headers{{"content-type", "application/json"}}})
	if v := h.Values("content-type"); len(v) != 1 || v[0] != "application/json" {
		t.Fatalf("the filter's content-type must win: %q", h)
	}
}

func TestMetricIDsFollowCppHost(t *testing.T) {
	r := newMetricRegistry()
	var ids metricIDs
	c := ids.define(r.define(MetricCounter, "c"))
	g := ids.define(r.define(MetricGauge, "g"))
	hi := ids.define(r.define(MetricHistogram, "h"))
	c2 := ids.define(r.define(MetricCounter, "c2"))
	if c != 4 || g != 5 || hi != 6 || c2 != 8 {
		t.Fatalf("ids = %d %d %d %d, want 4 5 6 8", c, g, hi, c2)
	}
	if _, ok := ids.lookup(5 | 4<<4); ok {
		t.Fatal("lookup of an undefined id succeeded")
	}
	m, _ := ids.lookup(c)
	if st := r.increment(m, 0); st != StatusBadArgument {
		t.Fatalf("counter += 0: %v, want BAD_ARGUMENT", st)
	}
	gm, _ := ids.lookup(g)
	r.increment(gm, 5)
	r.increment(gm, -7)
	if v, _ := r.get(gm); int64(v) != -2 {
		t.Fatalf("gauge = %d, want -2", int64(v))
	}
	hm, _ := ids.lookup(hi)
	if _, st := r.get(hm); st != StatusBadArgument {
		t.Fatalf("get histogram: %v, want BAD_ARGUMENT", st)
	}
}

func TestSharedDataCAS(t *testing.T) {
	s := newSharedData()
	if st := s.set("k", []byte("v1"), 12345); st != StatusOK {
		t.Fatalf("set of a missing key with a cas: %v, want OK (proxy-wasm-cpp-host)", st)
	}
	_, cas1, _ := s.get("k")
	if cas1 == 0 {
		t.Fatal("cas is 0")
	}
	if st := s.set("k", []byte("v2"), cas1); st != StatusOK {
		t.Fatalf("set with the current cas: %v", st)
	}
	if st := s.set("k", []byte("v3"), cas1); st != StatusCasMismatch {
		t.Fatalf("set with a stale cas: %v, want CAS_MISMATCH", st)
	}
	if st := s.set("k", []byte("v4"), 0); st != StatusOK {
		t.Fatalf("set with cas 0: %v", st)
	}
	v, cas3, _ := s.get("k")
	if string(v) != "v4" || cas3 == cas1 {
		t.Fatalf("get = %q cas %d", v, cas3)
	}
	s.nextCAS = 0xffffffff
	s.set("k", nil, 0)
	s.set("k", nil, 0)
	if _, cas, _ := s.get("k"); cas == 0 {
		t.Fatal("cas wrapped to 0")
	}
}

func TestSharedQueues(t *testing.T) {
	q := newSharedQueues()
	a := q.register("q", nil)
	if b := q.register("q", nil); b != a {
		t.Fatalf("re-registering gave token %d, want %d", b, a)
	}
	if _, st := q.dequeue(a); st != StatusEmpty {
		t.Fatalf("dequeue of an empty queue: %v", st)
	}
	q.enqueue(a, []byte("1"))
	q.enqueue(a, []byte("2"))
	if v, _ := q.dequeue(a); string(v) != "1" {
		t.Fatalf("dequeue = %q, want 1", v)
	}
	if _, st := q.enqueue(a+1, nil); st != StatusNotFound {
		t.Fatalf("enqueue on an unknown token: %v", st)
	}
	if tok, ok := q.resolve("q"); !ok || tok != a {
		t.Fatalf("resolve = %d %v", tok, ok)
	}
}

func TestPromName(t *testing.T) {
	for in, want := range map[string]string{"a.b-c": "a_b_c", "9lives": "_lives", "ok_name:x": "ok_name:x"} {
		if got := promName(in); got != want {
			t.Errorf("promName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestParseModes(t *testing.T) {
	for _, s := range []string{"envoy", "empty"} {
		m, err := ParseCallFailureMode(s)
		if err != nil || m.String() != s {
			t.Errorf("ParseCallFailureMode(%q) = %v, %v", s, m, err)
		}
	}
	if _, err := ParseCallFailureMode("loud"); err == nil {
		t.Error("ParseCallFailureMode accepted loud")
	}
	for l := LogTrace; l <= LogCritical; l++ {
		if got, err := ParseLogLevel(l.String()); err != nil || got != l {
			t.Errorf("ParseLogLevel(%q) = %v, %v", l, got, err)
		}
	}
}
