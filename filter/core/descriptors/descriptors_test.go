package descriptors

import (
	"bytes"
	"encoding/binary"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/filter/core/config"
)

// fakeRequest serves headers from a map; remote is the peer address.
type fakeRequest struct {
	headers map[string]string
	remote  string
}

func (r fakeRequest) RequestHeader(name string) (string, bool) {
	v, ok := r.headers[name]
	return v, ok
}

func (r fakeRequest) RemoteAddress() (string, bool) { return r.remote, r.remote != "" }

func mustConfig(t testing.TB, rateLimits string) *config.Config {
	t.Helper()
	c, err := config.Parse([]byte(`{"cluster":"cp","domain":"d","rate_limits":` + rateLimits + `}`))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestBuild(t *testing.T) {
	req := fakeRequest{
		headers: map[string]string{":path": "/v1/items?id=3", ":method": "GET", "x-api-key": "k1"},
		remote:  "10.1.2.3:5555",
	}
	tests := []struct {
		name       string
		rateLimits string
		req        fakeRequest
		want       []Descriptor
	}{
		{
			name:       "each action kind",
			rateLimits: `[{"actions":[{"remote_address":{}},{"request_headers":{"header_name":"X-Api-Key","descriptor_key":"key"}},{"path":{}},{"method":{"descriptor_key":"verb"}},{"generic_key":{"descriptor_value":"v"}}],"hits_addend":2}]`,
			req:        req,
			want: []Descriptor{{HitsAddend: 2, RateLimit: 0, Entries: []Entry{
				{"remote_address", "10.1.2.3"}, {"key", "k1"}, {"path", "/v1/items"}, {"verb", "GET"}, {"generic_key", "v"},
			}}},
		},
		{
			name:       "missing header drops the descriptor, others remain",
			rateLimits: `[{"actions":[{"request_headers":{"header_name":"x-user","descriptor_key":"user"}},{"method":{}}]},{"actions":[{"method":{}}]}]`,
			req:        req,
			want:       []Descriptor{{HitsAddend: 1, RateLimit: 1, Entries: []Entry{{"method", "GET"}}}},
		},
		{
			name:       "skip_if_absent drops only the entry",
			rateLimits: `[{"actions":[{"request_headers":{"header_name":"x-user","descriptor_key":"user","skip_if_absent":true}},{"method":{}}]}]`,
			req:        req,
			want:       []Descriptor{{HitsAddend: 1, Entries: []Entry{{"method", "GET"}}}},
		},
		{
			name:       "all entries skipped yields no descriptor",
			rateLimits: `[{"actions":[{"request_headers":{"header_name":"x-user","descriptor_key":"user","skip_if_absent":true}}]}]`,
			req:        req,
			want:       nil,
		},
		{
			name:       "no remote address",
			rateLimits: `[{"actions":[{"remote_address":{}}]},{"actions":[{"generic_key":{"descriptor_value":"g"}}]}]`,
			req:        fakeRequest{headers: req.headers},
			want:       []Descriptor{{HitsAddend: 1, RateLimit: 1, Entries: []Entry{{"generic_key", "g"}}}},
		},
		{
			name:       "non-IP remote address",
			rateLimits: `[{"actions":[{"remote_address":{}}]}]`,
			req:        fakeRequest{remote: "envoy://internal_client_address/"},
			want:       nil,
		},
		{
			name:       "several descriptors keep their order",
			rateLimits: `[{"actions":[{"remote_address":{}}]},{"actions":[{"path":{}}]},{"actions":[{"method":{}},{"path":{}}]}]`,
			req:        fakeRequest{headers: map[string]string{":path": "/a#frag", ":method": "POST"}, remote: "[2001:db8::7]:443"},
			want: []Descriptor{
				{HitsAddend: 1, RateLimit: 0, Entries: []Entry{{"remote_address", "2001:db8::7"}}},
				{HitsAddend: 1, RateLimit: 1, Entries: []Entry{{"path", "/a"}}},
				{HitsAddend: 1, RateLimit: 2, Entries: []Entry{{"method", "POST"}, {"path", "/a"}}},
			},
		},
	}
	var s Set
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s.Build(mustConfig(t, tt.rateLimits).RateLimits, tt.req)
			if len(s.Descriptors) == 0 && len(tt.want) == 0 {
				return
			}
			if !reflect.DeepEqual(s.Descriptors, tt.want) {
				t.Fatalf("got  %+v\nwant %+v", s.Descriptors, tt.want)
			}
		})
	}
}

func TestBuildRepairsInvalidUTF8(t *testing.T) {
	c := mustConfig(t, `[{"actions":[{"request_headers":{"header_name":"a","descriptor_key":"a"}},{"request_headers":{"header_name":"b","descriptor_key":"b"}}]}]`)
	var s Set
	s.Build(c.RateLimits, fakeRequest{headers: map[string]string{"a": "x\xff\xfey", "b": "ok\xc3"}})
	if len(s.Descriptors) != 1 {
		t.Fatalf("got %+v", s.Descriptors)
	}
	if got := s.Descriptors[0].Entries; got[0].Value != "x\uFFFDy" || got[1].Value != "ok\uFFFD" {
		t.Fatalf("got %q, %q", got[0].Value, got[1].Value)
	}
}

func TestHostIP(t *testing.T) {
	tests := []struct {
		addr, ip string
		ok       bool
	}{
		{"1.2.3.4:80", "1.2.3.4", true},
		{"1.2.3.4", "1.2.3.4", true},
		{"[::1]:8080", "::1", true},
		{"::1", "::1", true},
		{"2001:db8::1", "2001:db8::1", true},
		{"[fe80::1%eth0]:1", "fe80::1%eth0", true},
		{"[::1", "", false},
		{"localhost:80", "", false},
		{"/tmp/sock", "", false},
		{"", "", false},
	}
	for _, tt := range tests {
		ip, ok := HostIP(tt.addr)
		if ip != tt.ip || ok != tt.ok {
			t.Errorf("HostIP(%q) = %q, %v; want %q, %v", tt.addr, ip, ok, tt.ip, tt.ok)
		}
	}
}

func TestAppendKeyIsUnambiguous(t *testing.T) {
	a := Descriptor{Entries: []Entry{{"ab", "c"}}}
	b := Descriptor{Entries: []Entry{{"a", "bc"}}}
	c := Descriptor{Entries: []Entry{{"a", "b"}, {"c", ""}}}
	ka, kb, kc := AppendKey(nil, &a), AppendKey(nil, &b), AppendKey(nil, &c)
	if bytes.Equal(ka, kb) || bytes.Equal(ka, kc) || bytes.Equal(kb, kc) {
		t.Fatalf("keys collide: %q %q %q", ka, kb, kc)
	}
	if !bytes.Equal(AppendKey(nil, &a), ka) {
		t.Fatal("key not deterministic")
	}
}

func TestAppendKeyEncoding(t *testing.T) {
	long := strings.Repeat("v", 300) // a two-byte varint length
	d := Descriptor{Entries: []Entry{{"k", "v1"}, {"key", long}}}
	var want []byte
	for _, e := range d.Entries {
		want = binary.AppendUvarint(want, uint64(len(e.Key)))
		want = append(want, e.Key...)
		want = binary.AppendUvarint(want, uint64(len(e.Value)))
		want = append(want, e.Value...)
	}
	if got := AppendKey([]byte("prefix"), &d); !bytes.Equal(got, append([]byte("prefix"), want...)) {
		t.Fatalf("AppendKey = %q, want %q", got, want)
	}
}

func TestBuildAllocatesNothingOnceWarm(t *testing.T) {
	c := mustConfig(t, `[{"actions":[{"remote_address":{}},{"path":{}}]},{"actions":[{"method":{}}]}]`)
	req := &fakeRequest{headers: map[string]string{":path": "/x?y", ":method": "GET"}, remote: "10.0.0.1:1"}
	var s Set
	var key []byte
	s.Build(c.RateLimits, req)
	allocs := testing.AllocsPerRun(100, func() {
		s.Build(c.RateLimits, req)
		for i := range s.Descriptors {
			key = AppendKey(key[:0], &s.Descriptors[i])
		}
	})
	if allocs != 0 {
		t.Fatalf("Build allocates %v times per run", allocs)
	}
}

// TestAddKeepsEarlierDescriptors adds descriptors one at a time to a fresh
// set, so that the entries' storage moves several times, with dropped
// descriptors in between, and checks all of them after each Add.
func TestAddKeepsEarlierDescriptors(t *testing.T) {
	var rls []string
	for i := 0; i < 12; i++ {
		if i%4 == 3 { // a descriptor whose header is missing: dropped
			rls = append(rls, `{"actions":[{"generic_key":{"descriptor_value":"x"}},{"request_headers":{"header_name":"missing","descriptor_key":"m"}}]}`)
			continue
		}
		rls = append(rls, `{"actions":[{"generic_key":{"descriptor_value":"g`+strconv.Itoa(i)+`"}},{"method":{}},{"path":{}}]}`)
	}
	c := mustConfig(t, "["+strings.Join(rls, ",")+"]")
	req := fakeRequest{headers: map[string]string{":method": "GET", ":path": "/p"}}
	var s Set
	s.Reset()
	var want []Descriptor
	for i := range c.RateLimits {
		added := s.Add(&c.RateLimits[i], i, req)
		if added != (i%4 != 3) {
			t.Fatalf("rate limit %d: Add = %v", i, added)
		}
		if added {
			want = append(want, Descriptor{HitsAddend: 1, RateLimit: i, Entries: []Entry{
				{"generic_key", "g" + strconv.Itoa(i)}, {"method", "GET"}, {"path", "/p"}}})
		}
		if !reflect.DeepEqual(s.Descriptors, want) {
			t.Fatalf("after rate limit %d:\ngot  %+v\nwant %+v", i, s.Descriptors, want)
		}
	}
}

// TestParseKeyRoundTrip: ParseKey reads back what AppendKey wrote, and
// refuses a truncated key.
func TestParseKeyRoundTrip(t *testing.T) {
	d := Descriptor{Entries: []Entry{{"api_key", "k1"}, {"path", strings.Repeat("p", 300)}, {"e", ""}}}
	key := AppendKey(nil, &d)
	got, ok := ParseKey(nil, string(key))
	if !ok || len(got) != 3 || got[0] != d.Entries[0] || got[1] != d.Entries[1] || got[2] != d.Entries[2] {
		t.Fatalf("ParseKey = %v, %v", got, ok)
	}
	if _, ok := ParseKey(nil, string(key[:len(key)-1])); ok {
		t.Fatal("a truncated key was accepted")
	}
}
