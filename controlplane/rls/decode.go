package rls

import (
	"unicode/utf8"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
)

// Field numbers of RateLimitRequest, RateLimitDescriptor and its Entry.
const (
	requestDomain      = 1
	requestDescriptors = 2
	requestHitsAddend  = 3
	descriptorEntries  = 1
	descriptorNegative = 4
	entryKeyField      = 1
	entryValueField    = 2
)

// decodeRequest decodes the common RateLimitRequest (domain, descriptors
// made of entries, hits_addend, is_negative_hits) into r, which must be
// empty. It reports false, leaving r to be reset, for anything else (a
// descriptor's limit or hits_addend, an unknown field, a field repeated
// where protobuf merges, a wire type the field does not have, invalid
// UTF-8, malformed bytes): the caller then decodes with protobuf-go, which
// handles all of it. The strings share one copy of b.
func decodeRequest(b []byte, r *rlsv3.RateLimitRequest) bool {
	var text string // b as one string; fields are slices of it
	str := func(v []byte, at int) (string, bool) {
		if !utf8.Valid(v) {
			return "", false
		}
		if text == "" {
			text = string(b)
		}
		return text[at : at+len(v)], true
	}
	base := 0 // offset of the current field's value in b
	rest := b
	for len(rest) > 0 {
		num, typ, n := protowire.ConsumeTag(rest)
		if n < 0 {
			return false
		}
		rest = rest[n:]
		base = len(b) - len(rest)
		switch {
		case num == requestDomain && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(rest)
			if n < 0 {
				return false
			}
			s, ok := str(v, base+n-len(v))
			if !ok {
				return false
			}
			r.Domain = s
			rest = rest[n:]
		case num == requestDescriptors && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(rest)
			if n < 0 {
				return false
			}
			d, ok := decodeDescriptor(v, base+n-len(v), str)
			if !ok {
				return false
			}
			r.Descriptors = append(r.Descriptors, d)
			rest = rest[n:]
		case num == requestHitsAddend && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(rest)
			if n < 0 {
				return false
			}
			r.HitsAddend = uint32(v)
			rest = rest[n:]
		default:
			return false
		}
	}
	return true
}

// decodeDescriptor decodes one RateLimitDescriptor at offset at of the
// request; see decodeRequest.
func decodeDescriptor(b []byte, at int, str func([]byte, int) (string, bool)) (*ratelimitv3.RateLimitDescriptor, bool) {
	d := &ratelimitv3.RateLimitDescriptor{}
	rest := b
	for len(rest) > 0 {
		num, typ, n := protowire.ConsumeTag(rest)
		if n < 0 {
			return nil, false
		}
		rest = rest[n:]
		base := at + len(b) - len(rest)
		switch {
		case num == descriptorEntries && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(rest)
			if n < 0 {
				return nil, false
			}
			e, ok := decodeEntry(v, base+n-len(v), str)
			if !ok {
				return nil, false
			}
			d.Entries = append(d.Entries, e)
			rest = rest[n:]
		case num == descriptorNegative && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(rest)
			if n < 0 {
				return nil, false
			}
			d.IsNegativeHits = protowire.DecodeBool(v)
			rest = rest[n:]
		default:
			return nil, false
		}
	}
	return d, true
}

// decodeEntry decodes one descriptor entry at offset at of the request.
func decodeEntry(b []byte, at int, str func([]byte, int) (string, bool)) (*ratelimitv3.RateLimitDescriptor_Entry, bool) {
	e := &ratelimitv3.RateLimitDescriptor_Entry{}
	rest := b
	for len(rest) > 0 {
		num, typ, n := protowire.ConsumeTag(rest)
		if n < 0 || typ != protowire.BytesType || (num != entryKeyField && num != entryValueField) {
			return nil, false
		}
		rest = rest[n:]
		base := at + len(b) - len(rest)
		v, n := protowire.ConsumeBytes(rest)
		if n < 0 {
			return nil, false
		}
		s, ok := str(v, base+n-len(v))
		if !ok {
			return nil, false
		}
		if num == entryKeyField {
			e.Key = s
		} else {
			e.Value = s
		}
		rest = rest[n:]
	}
	return e, true
}
