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
	return decodeRequestIn(b, r, nil)
}

// decodeRequestIn is decodeRequest with the descriptors and entries taken
// from a (nil: allocated).
func decodeRequestIn(b []byte, r *rlsv3.RateLimitRequest, a *arena) bool {
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
			d, ok := decodeDescriptor(v, base+n-len(v), str, a)
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
		case num == QuotaField && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(rest)
			if n < 0 {
				return false
			}
			switch {
			case v == 1:
				r.ProtoReflect().SetUnknown(quotaMarker)
			case v != 0: // a caller named: kept (in a's buffer if any)
				var buf []byte
				if a != nil {
					buf = a.quota[:0]
				}
				r.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(buf, QuotaField, protowire.VarintType), v))
			}
			rest = rest[n:]
		default:
			return false
		}
	}
	return true
}

// decodeDescriptor decodes one RateLimitDescriptor at offset at of the
// request; see decodeRequest.
func decodeDescriptor(b []byte, at int, str func([]byte, int) (string, bool), a *arena) (*ratelimitv3.RateLimitDescriptor, bool) {
	d := a.descriptor()
	defer a.endDescriptor(d)
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
			e, ok := decodeEntry(v, a.entry(), base+n-len(v), str)
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
func decodeEntry(b []byte, e *ratelimitv3.RateLimitDescriptor_Entry, at int, str func([]byte, int) (string, bool)) (*ratelimitv3.RateLimitDescriptor_Entry, bool) {
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

// Capacities of an arena: requests with more descriptors or entries get the
// rest allocated.
const (
	arenaDescriptors = 8
	arenaEntries     = 16
)

// arena holds the messages of one decoded request for reuse. The wire path
// (ShouldRateLimitWire) decodes each request into a pooled arena and resets
// it once the answer is encoded: nothing keeps a request's messages after
// that.
type arena struct {
	req   rlsv3.RateLimitRequest
	descs [arenaDescriptors]ratelimitv3.RateLimitDescriptor
	ents  [arenaEntries]ratelimitv3.RateLimitDescriptor_Entry
	dptrs [arenaDescriptors]*ratelimitv3.RateLimitDescriptor
	eptrs [arenaEntries]*ratelimitv3.RateLimitDescriptor_Entry
	nd    int      // descs handed out
	ne    int      // ents handed out
	np    int      // eptrs taken by finished descriptors
	quota [12]byte // QuotaField with its caller: tag (2 bytes) and varint
}

// request returns the arena's empty request, its descriptor list backed by
// the arena.
func (a *arena) request() *rlsv3.RateLimitRequest {
	a.req.Descriptors = a.dptrs[:0]
	if len(a.req.ProtoReflect().GetUnknown()) > 0 {
		a.req.ProtoReflect().SetUnknown(nil) // a previous request's QuotaField
	}
	return &a.req
}

// descriptor returns an empty descriptor whose entry list is backed by the
// arena while it has room.
func (a *arena) descriptor() *ratelimitv3.RateLimitDescriptor {
	if a == nil || a.nd == len(a.descs) {
		return &ratelimitv3.RateLimitDescriptor{}
	}
	d := &a.descs[a.nd]
	a.nd++
	d.Entries = a.eptrs[a.np:a.np]
	return d
}

// endDescriptor accounts for the entry pointers d took from the arena.
func (a *arena) endDescriptor(d *ratelimitv3.RateLimitDescriptor) {
	if a == nil || len(d.Entries) == 0 || a.np == len(a.eptrs) || &d.Entries[0] != &a.eptrs[a.np] {
		return // none, or its list outgrew the arena's
	}
	a.np += len(d.Entries)
	d.Entries = d.Entries[:len(d.Entries):len(d.Entries)]
}

// entry returns an empty entry.
func (a *arena) entry() *ratelimitv3.RateLimitDescriptor_Entry {
	if a == nil || a.ne == len(a.ents) {
		return &ratelimitv3.RateLimitDescriptor_Entry{}
	}
	e := &a.ents[a.ne]
	a.ne++
	return e
}

// reset empties the arena for the next request, dropping every reference.
func (a *arena) reset() {
	a.req.Reset()
	for i := range a.nd {
		a.descs[i].Reset()
	}
	for i := range a.ne {
		a.ents[i].Reset()
	}
	clear(a.dptrs[:])
	clear(a.eptrs[:])
	a.nd, a.ne, a.np = 0, 0, 0
}
