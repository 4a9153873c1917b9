package rlsproto

// QuotaField is the RateLimitRequest field (not in rls.proto) by which the
// filter tells sluice's control plane that it spends quotas: a varint that
// names the caller, one number per Envoy, never 0
// (controlplane/rls.QuotaField).
const QuotaField = 1000

// quotaTag is QuotaField's tag (1000 << 3 | varint) encoded.
var quotaTag = []byte{0xc0, 0x3e}

// Quota is a DescriptorStatus.quota: Requests matching requests granted in
// advance (the request answered takes one of them), to be spent by the
// caller without asking again until ValidUntil. Requests is 0 when the
// status carried none.
type Quota struct {
	Requests   uint32
	ValidUntil int64 // Unix nanoseconds; 0 when unset
	ID         string
}

// decodeQuota decodes a RateLimitResponse.Quota. valid_until is a
// Timestamp, which has Duration's wire form.
func decodeQuota(b []byte, q *Quota) error {
	r := reader{b}
	for {
		field, wire, ok, err := r.next()
		if err != nil || !ok {
			return err
		}
		switch field {
		case 1: // requests
			v, err := r.varintField(wire)
			if err != nil {
				return err
			}
			q.Requests = uint32(v)
		case 2: // valid_until
			tb, err := r.bytesField(wire)
			if err != nil {
				return err
			}
			if q.ValidUntil, err = decodeDuration(tb); err != nil {
				return err
			}
		case 3: // id
			ib, err := r.bytesField(wire)
			if err != nil {
				return err
			}
			q.ID = str(ib)
		default:
			if err := r.skip(wire); err != nil {
				return err
			}
		}
	}
}
