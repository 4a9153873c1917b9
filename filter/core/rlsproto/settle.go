package rlsproto

import (
	"encoding/binary"

	"github.com/sluicehq/sluice/filter/core/descriptors"
)

// SettleHeader is the request header that makes a ShouldRateLimit call a
// settlement (the settlement contract): its value, the batch's token, is
// reused unchanged on every retry, and the control plane applies each
// (token, descriptor index) at most once.
const SettleHeader = "x-sluice-settle"

// MaxSettleDescriptors is the most descriptors one settle call carries.
const MaxSettleDescriptors = 64

// settleLen returns the size of the RateLimitRequest AppendSettleFrame
// encodes.
func settleLen(domain string, descs []descriptors.Descriptor, amounts []int64) int {
	n := 0
	if domain != "" {
		n += bytesFieldLen(len(domain))
	}
	for i := range descs {
		n += bytesFieldLen(settleDescriptorLen(&descs[i], amounts[i]))
	}
	return n
}

// isNegativeHitsLen is the size of is_negative_hits: true (field 4, a
// varint).
const isNegativeHitsLen = 2

func settleDescriptorLen(d *descriptors.Descriptor, amount int64) int {
	n := bytesFieldLen(wrapperLen(magnitude(amount)))
	if amount < 0 {
		n += isNegativeHitsLen
	}
	for i := range d.Entries {
		n += bytesFieldLen(entryLen(&d.Entries[i]))
	}
	return n
}

// magnitude is |amount|.
func magnitude(amount int64) uint64 {
	if amount < 0 {
		return uint64(-amount)
	}
	return uint64(amount)
}

// AppendSettleFrame appends a settle call's RateLimitRequest as one gRPC
// message: the domain, and each descriptor with its own hits_addend, the
// amount amounts[i] (len(amounts) == len(descs)): a charge when positive,
// a refund (|amount| with is_negative_hits) when negative. It carries no
// request-level hits_addend and does not ask for quotas.
func AppendSettleFrame(dst []byte, domain string, descs []descriptors.Descriptor, amounts []int64) []byte {
	dst = append(dst, 0)
	dst = binary.BigEndian.AppendUint32(dst, uint32(settleLen(domain, descs, amounts)))
	if domain != "" {
		dst = appendBytesField(dst, 1, domain)
	}
	for i := range descs {
		d := &descs[i]
		dst = binary.AppendUvarint(dst, tag(2, wireBytes))
		dst = binary.AppendUvarint(dst, uint64(settleDescriptorLen(d, amounts[i])))
		dst = appendEntries(dst, d)
		dst = appendWrapper(dst, magnitude(amounts[i]))
		if amounts[i] < 0 {
			dst = append(dst, byte(tag(4, wireVarint)), 1)
		}
	}
	return dst
}
