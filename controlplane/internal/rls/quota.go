package rls

import (
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/sluicehq/sluice/controlplane/store"
)

// QuotaField is the RateLimitRequest field number (not in rls.proto) by
// which a caller says that it spends DescriptorStatus.quota: a varint, not
// 0. Its value names the caller (one data plane: sluice's filter sends one
// number per Envoy, whichever worker calls), so that a lease is shared
// among the callers of a key; 1 is any caller that names none.
// sluice's filter sends it. Other callers (Envoy's own ratelimit filter
// ignores quota) are granted none, since a share nobody spends is lost to
// everyone until it expires.
const QuotaField = 1000

// quotaMarker is QuotaField = 1 encoded, as the request's unknown fields.
var quotaMarker = protowire.AppendVarint(protowire.AppendTag(nil, QuotaField, protowire.VarintType), 1)

// quotaCaller returns the value of QuotaField in req (decoded as an
// unknown field): the caller spending quotas, or 0 when it spends none.
func quotaCaller(req *rlsv3.RateLimitRequest) uint64 {
	b := req.ProtoReflect().GetUnknown()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0
		}
		b = b[n:]
		if num == QuotaField && typ == protowire.VarintType {
			v, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return 0
			}
			return v
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return 0
		}
		b = b[m:]
	}
	return 0
}

// acceptsQuota reports whether req's caller spends quotas.
func acceptsQuota(req *rlsv3.RateLimitRequest) bool { return quotaCaller(req) != 0 }

// Sharer hands part of a replica's lease on a key to a data plane, caller
// (see controlplane/internal/lease): n units, already debited in Redis, that the
// caller may admit on its own until valid has passed; 0 when there is
// nothing to share or less than minValid left of it.
type Sharer interface {
	Share(key string, l store.Limit, minValid time.Duration, caller uint64) (n int64, valid time.Duration)
}

// Quota timing. A share is given only with at least minQuotaValid left,
// and its valid_until is taken in by quotaMargin: the filter compares it
// with its own wall clock, so the clocks of the control plane and the data
// plane are assumed to agree within quotaMargin (a share spent after its
// lease ended could be counted in the next window). A margin in proportion
// to the validity (a tenth of a 1 s window) cut every window's last tenth
// out of the quota, each Envoy calling again for it.
const (
	minQuotaValid = 20 * time.Millisecond
	quotaMargin   = 10 * time.Millisecond
)

// addQuotas sets DescriptorStatus.quota on the allowed descriptors whose one
// limit is leased (`lease: auto`), cost 1, not in shadow mode: requests is
// the share plus the request being answered, as the field counts it.
func (s *Service) addQuotas(p *pending, resp *rlsv3.RateLimitResponse, storeErr error) {
	if s.quota == nil || storeErr != nil || p.caller == 0 {
		return
	}
	slots, checks := p.sc.slots, p.sc.checks
	var now time.Time
	for k := range slots {
		sl := &slots[k]
		if !sl.lim.Lease || sl.lim.ShadowMode || sl.cost != 1 || sl.tooLarge || !checks[k].Limit.Lease || checks[k].Mode != store.Take ||
			(k > 0 && slots[k-1].desc == sl.desc) || (k+1 < len(slots) && slots[k+1].desc == sl.desc) {
			continue // one leased limit on the descriptor, or none is shared
		}
		st := resp.Statuses[sl.desc]
		if st.Code != rlsv3.RateLimitResponse_OK {
			continue
		}
		n, valid := s.quota.Share(checks[k].Key, checks[k].Limit, minQuotaValid, p.caller)
		if n <= 0 {
			continue
		}
		if now.IsZero() {
			now = time.Now()
		}
		valid -= quotaMargin
		st.Quota = &rlsv3.RateLimitResponse_Quota{
			Requests:            uint32(min(n+1, 1<<31)),
			ExpirationSpecifier: &rlsv3.RateLimitResponse_Quota_ValidUntil{ValidUntil: timestamppb.New(now.Add(valid))},
		}
	}
}
