// Package descriptors builds rate limit descriptors from a request, following
// the configured actions the way Envoy's route rate_limits do: each
// configured rate limit yields one descriptor whose entries come from its
// actions in order, or no descriptor when an action cannot produce its entry.
package descriptors

import (
	"encoding/binary"
	"strings"
	"unicode/utf8"
	"unsafe"

	"github.com/sluicehq/sluice/filter/config"
)

// Entry is one key/value pair of a descriptor.
type Entry struct {
	Key   string
	Value string
}

// Descriptor is one rate limit descriptor.
type Descriptor struct {
	Entries    []Entry // in action order; never empty
	HitsAddend uint32  // cost of the request for this descriptor, >= 1
	RateLimit  int     // index of the configured rate limit that produced it
}

// Request is what the actions read from a request. Returned strings need only
// stay valid until Build returns.
type Request interface {
	// Header returns the value of a request header; name is lower case.
	// Pseudo-headers (":path", ":method", ...) are headers too.
	Header(name string) (string, bool)
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
}

// Build replaces the set's descriptors with those the rate limits produce for
// req. The entries' strings are the ones req returned, except that values
// that are not valid UTF-8 are repaired (each invalid byte sequence becomes
// U+FFFD): protobuf strings must be UTF-8, and a control plane would reject
// the whole request otherwise, which a client could use to trigger the
// failure mode at will.
func (s *Set) Build(rateLimits []config.RateLimit, req Request) {
	s.Descriptors = s.Descriptors[:0]
	s.entries = s.entries[:0]
	s.text = s.text[:0]
	s.bounds = append(s.bounds[:0], 0)
	for i := range rateLimits {
		rl := &rateLimits[i]
		start := len(s.entries)
		ok := true
		for j := range rl.Actions {
			e, produced, keep := entry(&rl.Actions[j], req)
			if !keep {
				ok = false
				break
			}
			if produced {
				if !utf8.ValidString(e.Value) {
					e.Value = s.repair(e.Value)
				}
				s.entries = append(s.entries, e)
			}
		}
		if !ok || len(s.entries) == start {
			s.entries = s.entries[:start]
			continue
		}
		s.bounds = append(s.bounds, len(s.entries))
		s.Descriptors = append(s.Descriptors, Descriptor{HitsAddend: rl.HitsAddend, RateLimit: i})
	}
	// Slice the entries only now: appends above may have moved them.
	for i := range s.Descriptors {
		s.Descriptors[i].Entries = s.entries[s.bounds[i]:s.bounds[i+1]:s.bounds[i+1]]
	}
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

// entry evaluates one action. produced reports whether it yields an entry;
// keep is false when the whole descriptor must be dropped.
func entry(a *config.Action, req Request) (e Entry, produced, keep bool) {
	e.Key = a.DescriptorKey
	switch a.Kind {
	case config.GenericKey:
		e.Value = a.DescriptorValue
		return e, true, true
	case config.RequestHeader:
		v, ok := req.Header(a.HeaderName)
		if !ok {
			// Envoy: a missing header drops the descriptor unless
			// skip_if_absent, which drops only the entry.
			return e, false, a.SkipIfAbsent
		}
		e.Value = v
		return e, true, true
	case config.Method:
		v, ok := req.Header(":method")
		if !ok || v == "" {
			return e, false, false
		}
		e.Value = v
		return e, true, true
	case config.Path:
		v, ok := req.Header(":path")
		if !ok {
			return e, false, false
		}
		v = StripQuery(v)
		if v == "" {
			return e, false, false
		}
		e.Value = v
		return e, true, true
	case config.RemoteAddress:
		v, ok := req.RemoteAddress()
		if !ok {
			return e, false, false
		}
		ip, ok := HostIP(v)
		if !ok {
			return e, false, false
		}
		e.Value = ip
		return e, true, true
	}
	return e, false, false
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
	for _, e := range d.Entries {
		dst = binary.AppendUvarint(dst, uint64(len(e.Key)))
		dst = append(dst, e.Key...)
		dst = binary.AppendUvarint(dst, uint64(len(e.Value)))
		dst = append(dst, e.Value...)
	}
	return dst
}
