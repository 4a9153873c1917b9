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
func settleLen(domain string, descs []descriptors.Descriptor, charges []uint64) int {
	n := 0
	if domain != "" {
		n += bytesFieldLen(len(domain))
	}
	for i := range descs {
		n += bytesFieldLen(settleDescriptorLen(&descs[i], charges[i]))
	}
	return n
}

func settleDescriptorLen(d *descriptors.Descriptor, charge uint64) int {
	n := bytesFieldLen(wrapperLen(charge))
	for i := range d.Entries {
		n += bytesFieldLen(entryLen(&d.Entries[i]))
	}
	return n
}

// AppendSettleFrame appends a settle call's RateLimitRequest as one gRPC
// message: the domain, and each descriptor with its own hits_addend, the
// charge charges[i] (len(charges) == len(descs)). It carries no
// request-level hits_addend and does not ask for quotas.
func AppendSettleFrame(dst []byte, domain string, descs []descriptors.Descriptor, charges []uint64) []byte {
	dst = append(dst, 0)
	dst = binary.BigEndian.AppendUint32(dst, uint32(settleLen(domain, descs, charges)))
	if domain != "" {
		dst = appendBytesField(dst, 1, domain)
	}
	for i := range descs {
		d := &descs[i]
		dst = binary.AppendUvarint(dst, tag(2, wireBytes))
		dst = binary.AppendUvarint(dst, uint64(settleDescriptorLen(d, charges[i])))
		dst = appendEntries(dst, d)
		dst = appendWrapper(dst, charges[i])
	}
	return dst
}
