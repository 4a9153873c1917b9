// Package rlsproto encodes envoy.service.ratelimit.v3.RateLimitRequest and
// decodes RateLimitResponse in the protobuf wire format, by hand, with gRPC's
// length-prefixed message framing. It links no generated protobuf code: the
// generated go-control-plane types would make filter.wasm about 25 MB.
//
// Field numbers follow envoy/service/ratelimit/v3/rls.proto and
// envoy/extensions/common/ratelimit/v3/ratelimit.proto. The tests check the
// encoding against the generated types.
package rlsproto

import (
	"encoding/binary"
	"math/bits"

	"github.com/sluicehq/sluice/filter/core/descriptors"
)

// ShouldRateLimitPath is the gRPC method the filter calls.
const ShouldRateLimitPath = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// CallHeaders returns the request headers of a ShouldRateLimit call over
// HTTP/2 to authority with a deadline of timeout (ns), then extra.
func CallHeaders(authority string, timeout int64, extra ...[2]string) [][2]string {
	return append([][2]string{
		{":method", "POST"},
		{":path", ShouldRateLimitPath},
		{":authority", authority},
		{":scheme", "http"},
		{"content-type", "application/grpc"},
		{"te", "trailers"},
		{"grpc-timeout", string(AppendGRPCTimeout(nil, timeout))},
	}, extra...)
}

// Wire types.
const (
	wireVarint  = 0
	wireFixed64 = 1
	wireBytes   = 2
	wireFixed32 = 5
)

// tag returns the key of a field.
func tag(field, wire uint64) uint64 { return field<<3 | wire }

// uvarintLen returns the encoded size of v as a varint.
func uvarintLen(v uint64) int { return (bits.Len64(v|1) + 6) / 7 }

// bytesFieldLen returns the size of a length-delimited field with a
// one-byte tag and n bytes of payload.
func bytesFieldLen(n int) int { return 1 + uvarintLen(uint64(n)) + n }

func appendBytesField(dst []byte, field uint64, s string) []byte {
	dst = binary.AppendUvarint(dst, tag(field, wireBytes))
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// requestCost returns the request-level hits_addend, whether every
// descriptor has that cost, and whether the request may spend quotas (no
// descriptor is usage-based). A cost of 0 (a probe) is never sent at the
// request level, where 0 means 1: each descriptor of cost 0 carries its own.
func requestCost(descs []descriptors.Descriptor) (cost uint32, uniform, quota bool) {
	if len(descs) == 0 {
		return 1, true, true
	}
	cost, uniform, quota = descs[0].HitsAddend, true, true
	for i := range descs {
		if descs[i].HitsAddend != cost {
			uniform = false
		}
		if descs[i].Usage || descs[i].NoQuota {
			quota = false
		}
	}
	if !uniform || cost == 0 {
		return 1, false, quota
	}
	return cost, true, quota
}

// appendEntries appends the entries of d, field 1 of a
// RateLimitDescriptor each.
func appendEntries(dst []byte, d *descriptors.Descriptor) []byte {
	for j := range d.Entries {
		e := &d.Entries[j]
		dst = binary.AppendUvarint(dst, tag(1, wireBytes))
		dst = binary.AppendUvarint(dst, uint64(entryLen(e)))
		if e.Key != "" {
			dst = appendBytesField(dst, 1, e.Key)
		}
		if e.Value != "" {
			dst = appendBytesField(dst, 2, e.Value)
		}
	}
	return dst
}

func entryLen(e *descriptors.Entry) int {
	n := 0
	if e.Key != "" {
		n += bytesFieldLen(len(e.Key))
	}
	if e.Value != "" {
		n += bytesFieldLen(len(e.Value))
	}
	return n
}

// descriptorLen returns the size of an encoded RateLimitDescriptor;
// perDescriptorCost says whether it carries its own hits_addend.
func descriptorLen(d *descriptors.Descriptor, perDescriptorCost bool) int {
	n := 0
	for i := range d.Entries {
		n += bytesFieldLen(entryLen(&d.Entries[i]))
	}
	if perDescriptorCost {
		n += bytesFieldLen(wrapperLen(uint64(d.HitsAddend))) // UInt64Value{value}
	}
	return n
}

// wrapperLen returns the size of a UInt64Value holding v: empty for 0, as
// proto3 leaves a zero scalar out.
func wrapperLen(v uint64) int {
	if v == 0 {
		return 0
	}
	return 1 + uvarintLen(v)
}

// appendWrapper appends field 3 of a RateLimitDescriptor, the UInt64Value
// hits_addend holding v.
func appendWrapper(dst []byte, v uint64) []byte {
	dst = binary.AppendUvarint(dst, tag(3, wireBytes))
	dst = binary.AppendUvarint(dst, uint64(wrapperLen(v)))
	if v != 0 {
		dst = binary.AppendUvarint(dst, tag(1, wireVarint))
		dst = binary.AppendUvarint(dst, v)
	}
	return dst
}

// RequestLen returns the size of the RateLimitRequest AppendRequest encodes.
func RequestLen(domain string, descs []descriptors.Descriptor, caller uint64) int {
	cost, uniform, quota := requestCost(descs)
	n := 0
	if domain != "" {
		n += bytesFieldLen(len(domain))
	}
	for i := range descs {
		n += bytesFieldLen(descriptorLen(&descs[i], !uniform && descs[i].HitsAddend != 1))
	}
	n += 1 + uvarintLen(uint64(cost))
	if quota {
		n += len(quotaTag) + uvarintLen(max(caller, 1))
	}
	return n
}

// AppendRequest appends an encoded RateLimitRequest to dst.
//
// It ends with field QuotaField = caller (1 for 0), which is not in
// rls.proto: it tells sluice's control plane that this caller spends
// DescriptorStatus.quota, and which caller it is (other RLS servers skip it
// as an unknown field). A request with a usage-based descriptor leaves it
// out: usage-based limits do not use leases, whose units are requests of
// cost 1; so does one with a descriptor that asks for none (NoQuota).
//
// The cost of a request is hits_addend: when every descriptor has the same
// cost it is sent once, at the request level (what every RLS implementation
// reads); otherwise the request level says 1 and each descriptor whose cost
// differs carries its own hits_addend (RateLimitDescriptor.hits_addend, which
// overrides the request's).
func AppendRequest(dst []byte, domain string, descs []descriptors.Descriptor, caller uint64) []byte {
	cost, uniform, quota := requestCost(descs)
	if domain != "" {
		dst = appendBytesField(dst, 1, domain)
	}
	for i := range descs {
		d := &descs[i]
		own := !uniform && d.HitsAddend != 1
		dst = binary.AppendUvarint(dst, tag(2, wireBytes))
		dst = binary.AppendUvarint(dst, uint64(descriptorLen(d, own)))
		dst = appendEntries(dst, d)
		if own {
			dst = appendWrapper(dst, uint64(d.HitsAddend))
		}
	}
	dst = binary.AppendUvarint(dst, tag(3, wireVarint))
	dst = binary.AppendUvarint(dst, uint64(cost))
	if quota {
		dst = binary.AppendUvarint(append(dst, quotaTag...), max(caller, 1))
	}
	return dst
}

// FrameHeaderLen is the size of gRPC's message prefix: a compressed flag and
// a big-endian 32-bit length.
const FrameHeaderLen = 5

// AppendRequestFrame appends a RateLimitRequest as one gRPC message: the
// 5-byte prefix (uncompressed) and the encoded message.
func AppendRequestFrame(dst []byte, domain string, descs []descriptors.Descriptor, caller uint64) []byte {
	n := RequestLen(domain, descs, caller)
	dst = append(dst, 0)
	dst = binary.BigEndian.AppendUint32(dst, uint32(n))
	return AppendRequest(dst, domain, descs, caller)
}
