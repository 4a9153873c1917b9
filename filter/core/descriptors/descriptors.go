// Package descriptors builds rate limit descriptors from a request, following
// the configured actions the way Envoy's route rate_limits do: each
// configured rate limit yields one descriptor whose entries come from its
// actions in order, or no descriptor when an action cannot produce its entry.
package descriptors

import (
	"encoding/binary"
	"math"
	"strings"
	"unicode/utf8"
	"unsafe"

	"github.com/sluicehq/sluice/filter/core/config"
)

// Entry is one key/value pair of a descriptor.
type Entry struct {
	Key   string
	Value string
}

// Descriptor is one rate limit descriptor.
type Descriptor struct {
	Entries    []Entry // in action order; never empty
	HitsAddend uint32  // cost of the request for this descriptor: >= 1, or 0 for a usage-based probe
	RateLimit  int     // index of the configured rate limit that produced it
	Usage      bool    // the rate limit is usage-based (config.RateLimit.Usage)
	// NoQuota says that the request asks for no quota for it: its lease
	// pool's slot is another key's (the lease stage sets it).
	NoQuota bool
}

// PrecheckCost is the cost the precheck checks the descriptor at: its
// cost, or 1 for a probe (cost 0), which the control plane refuses exactly
// when a request of cost 1 would be refused.
func (d *Descriptor) PrecheckCost() int64 { return max(1, int64(d.HitsAddend)) }

// Request is what the actions read from a request. Returned strings need only
// stay valid until Build returns. The filter's proxy host implements it.
type Request interface {
	// RequestHeader returns the value of a request header; name is lower
	// case. Pseudo-headers (":path", ":method", ...) are headers too.
	RequestHeader(name string) (string, bool)
	// RemoteAddress returns the downstream peer address as the proxy reports
	// it: "ip:port", "[ipv6]:port" or a bare IP.
	RemoteAddress() (string, bool)
}

// Set holds the descriptors of one request. Reuse a Set across requests:
// once its storage has grown to fit, Build allocates nothing.
type Set struct {
	Descriptors []Descriptor // the descriptors built by the last Build
	entries     []Entry      // backing storage of the descriptors' entries
	bounds      []int        // entries[bounds[i]:bounds[i+1]] belong to Descriptors[i]
	text        []byte       // storage of values that had to be repaired
	// Reserves is, when set, the request-time cost of each rate limit (by
	// index) whose reserve is sized from the request body
	// (config.Usage.FromRequest); the caller sets it before Add.
	Reserves []uint32
}

// Build replaces the set's descriptors with those the rate limits produce for
// req: Reset, then Add for each rate limit.
func (s *Set) Build(rateLimits []config.RateLimit, req Request) {
	s.Reset()
	for i := range rateLimits {
		s.Add(&rateLimits[i], i, req)
	}
}

// Reset empties the set for a new request.
func (s *Set) Reset() {
	s.Descriptors = s.Descriptors[:0]
	s.entries = s.entries[:0]
	s.text = s.text[:0]
	s.bounds = append(s.bounds[:0], 0)
}

// Add evaluates rate limit rl, the index-th configured one, for req and
// appends the descriptor it produces, if any; it reports whether it did.
// Adding rate limits one at a time lets a caller stop early: the filter
// prechecks each descriptor as soon as it is built, and a request rejected
// on the first one needs none of the host calls the others would make.
//
// The entries' strings are the ones req returned, except that values that
// are not valid UTF-8 are repaired (each invalid byte sequence becomes
// U+FFFD): protobuf strings must be UTF-8, and a control plane would reject
// the whole request otherwise, which a client could use to trigger the
// failure mode at will.
func (s *Set) Add(rl *config.RateLimit, index int, req Request) bool {
	start, oldCap := len(s.entries), cap(s.entries)
	for j := range rl.Actions {
		a := &rl.Actions[j]
		v, produced, keep := value(a, req)
		if !keep {
			s.entries = s.entries[:start]
			return false
		}
		if produced {
			if a.Kind != config.RemoteAddress && !utf8.ValidString(v) {
				v = s.repair(v) // (an address HostIP accepts is ASCII)
			}
			s.entries = append(s.entries, Entry{Key: a.DescriptorKey, Value: v})
		}
	}
	if len(s.entries) == start {
		return false
	}
	s.bounds = append(s.bounds, len(s.entries))
	// Grow Descriptors by one and set the new one's fields in place: in
	// filter.wasm, appending a composite literal zeroes and copies it
	// through memory.fill and memory.copy, a call each under wazero.
	n := len(s.Descriptors)
	if n < cap(s.Descriptors) {
		s.Descriptors = s.Descriptors[:n+1]
	} else {
		s.Descriptors = append(s.Descriptors, Descriptor{})
	}
	d := &s.Descriptors[n]
	d.HitsAddend, d.RateLimit, d.Usage, d.NoQuota = rl.HitsAddend, index, rl.Usage != nil, false
	if u := rl.Usage; u != nil {
		switch {
		case u.FromRequest && index < len(s.Reserves):
			d.HitsAddend = s.Reserves[index]
		case u.RequestHeader != "":
			d.HitsAddend = requestCost(u.RequestHeader, d.HitsAddend, req)
		}
	}
	d.Entries = s.entries[start:len(s.entries):len(s.entries)]
	if cap(s.entries) != oldCap {
		// The appends moved the storage: slice the earlier ones again.
		for i := 0; i < n; i++ {
			s.Descriptors[i].Entries = s.entries[s.bounds[i]:s.bounds[i+1]:s.bounds[i+1]]
		}
	}
	return true
}

// requestCost returns a usage-based descriptor's cost: the value of its
// request header, when the request has it as a whole number (0 to
// 2^32-1), else its reserve.
func requestCost(header string, reserve uint32, req Request) uint32 {
	v, ok := req.RequestHeader(header)
	if !ok {
		return reserve
	}
	if n, ok := ParseCost(v); ok && n <= math.MaxUint32 {
		return uint32(n)
	}
	return reserve
}

// ParseCost parses a cost value (a request's reserve, a response's usage):
// a whole number of decimal digits, at most config.MaxCost, optionally
// surrounded by spaces or tabs.
func ParseCost(v string) (int64, bool) {
	for len(v) > 0 && (v[0] == ' ' || v[0] == '\t') {
		v = v[1:]
	}
	for len(v) > 0 && (v[len(v)-1] == ' ' || v[len(v)-1] == '\t') {
		v = v[:len(v)-1]
	}
	if v == "" || len(v) > 16 {
		return 0, false
	}
	var n int64
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	if n > config.MaxCost {
		return 0, false
	}
	return n, true
}

// repair returns v with invalid UTF-8 replaced, stored in s.text. Strings
// made earlier stay valid if s.text grows: they keep the old array alive.
func (s *Set) repair(v string) string {
	start := len(s.text)
	for len(v) > 0 {
		r, size := utf8.DecodeRuneInString(v)
		if r == utf8.RuneError && size == 1 {
			s.text = utf8.AppendRune(s.text, utf8.RuneError)
			for len(v) > 0 { // one replacement per run of invalid bytes
				if r, size = utf8.DecodeRuneInString(v); r != utf8.RuneError || size != 1 {
					break
				}
				v = v[1:]
			}
			continue
		}
		s.text = append(s.text, v[:size]...)
		v = v[size:]
	}
	b := s.text[start:]
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// value evaluates one action: the entry's value. produced reports whether
// the action yields an entry; keep is false when the whole descriptor must
// be dropped.
func value(a *config.Action, req Request) (v string, produced, keep bool) {
	switch a.Kind {
	case config.GenericKey:
		return a.DescriptorValue, true, true
	case config.RequestHeader:
		v, ok := req.RequestHeader(a.HeaderName)
		if !ok {
			// Envoy: a missing header drops the descriptor unless
			// skip_if_absent, which drops only the entry.
			return "", false, a.SkipIfAbsent
		}
		return v, true, true
	case config.Method:
		v, ok := req.RequestHeader(":method")
		if !ok || v == "" {
			return "", false, false
		}
		return v, true, true
	case config.Path:
		v, ok := req.RequestHeader(":path")
		if !ok {
			return "", false, false
		}
		v = StripQuery(v)
		if v == "" {
			return "", false, false
		}
		return v, true, true
	case config.RemoteAddress:
		v, ok := req.RemoteAddress()
		if !ok {
			return "", false, false
		}
		ip, ok := HostIP(v)
		if !ok {
			return "", false, false
		}
		return ip, true, true
	}
	return "", false, false
}

// StripQuery returns the path without its query string and fragment.
func StripQuery(path string) string {
	if i := strings.IndexAny(path, "?#"); i >= 0 {
		return path[:i]
	}
	return path
}

// HostIP returns the IP part of an address as Envoy formats the downstream
// remote address ("1.2.3.4:80", "[2001:db8::1]:443", or a bare IP), as a
// substring of addr. ok is false when addr holds no IP address (a pipe, an
// internal address).
func HostIP(addr string) (ip string, ok bool) {
	// The common case, an IPv4 address with or without a port, in one pass.
	if n := dottedQuadPrefix(addr); n > 0 {
		if n == len(addr) {
			return addr, true
		}
		if addr[n] == ':' && strings.IndexByte(addr[n+1:], ':') < 0 {
			return addr[:n], true
		}
	}
	return hostIP(addr)
}

// hostIP is HostIP for any address.
func hostIP(addr string) (ip string, ok bool) {
	host := addr
	switch {
	case strings.HasPrefix(addr, "["):
		end := strings.IndexByte(addr, ']')
		if end < 0 {
			return "", false
		}
		host = addr[1:end]
	case strings.Count(addr, ":") == 1:
		host = addr[:strings.IndexByte(addr, ':')]
	}
	if !isIP(host) {
		return "", false
	}
	return host, true
}

// AppendKey appends an unambiguous binary encoding of d's entries to dst:
// for each entry, the key's length, the key, the value's length, the value,
// lengths as unsigned varints. Equal keys mean equal descriptors.
func AppendKey(dst []byte, d *Descriptor) []byte {
	for i := range d.Entries {
		e := &d.Entries[i]
		dst = appendLen(dst, len(e.Key))
		dst = append(dst, e.Key...)
		dst = appendLen(dst, len(e.Value))
		dst = append(dst, e.Value...)
	}
	return dst
}

// ParseKey decodes a key AppendKey wrote into entries appended to dst,
// whose strings are substrings of key; ok is false when key is not such an
// encoding.
func ParseKey(dst []Entry, key string) (entries []Entry, ok bool) {
	for len(key) > 0 {
		var kv [2]string
		for j := range kv {
			var n uint64
			w := 0
			for shift := 0; ; shift += 7 {
				if w >= len(key) || shift > 56 {
					return dst, false
				}
				c := key[w]
				w++
				n |= uint64(c&0x7f) << shift
				if c < 0x80 {
					break
				}
			}
			if n > uint64(len(key)-w) {
				return dst, false
			}
			kv[j] = key[w : w+int(n)]
			key = key[w+int(n):]
		}
		dst = append(dst, Entry{Key: kv[0], Value: kv[1]})
	}
	return dst, true
}

// appendLen appends n as an unsigned varint; a length under 128, the usual
// case, is one byte, appended without binary.AppendUvarint's loop.
func appendLen(dst []byte, n int) []byte {
	if n < 0x80 {
		return append(dst, byte(n))
	}
	return binary.AppendUvarint(dst, uint64(n))
}

// AppendParsed rebuilds the descriptor of key (AppendKey's encoding), of
// cost hits, onto descs, its entries onto entries (strings of key): for a
// call made after the request that built the descriptor (a settlement, a
// lease renewal, a request that waited). ok is false, and nothing is
// appended, when key is not such an encoding.
func AppendParsed(descs []Descriptor, entries []Entry, key string, hits uint32) ([]Descriptor, []Entry, bool) {
	start := len(entries)
	entries, ok := ParseKey(entries, key)
	if !ok {
		return descs, entries[:start], false
	}
	return append(descs, Descriptor{Entries: entries[start:len(entries):len(entries)], HitsAddend: hits}), entries, true
}
