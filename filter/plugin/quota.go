package plugin

import (
	"github.com/sluicehq/sluice/filter/rlsproto"
)

// MetricQuotaAllowed counts requests admitted from a quota the control plane
// granted in advance (RLS DescriptorStatus.quota), without a call.
const MetricQuotaAllowed = "sluice.quota_allowed"

// maxQuotas bounds the descriptors a plugin instance holds quotas for.
const maxQuotas = 4096

// quota is what is left of one descriptor's quota: left requests, to be
// spent before until (the host's monotonic clock).
type quota struct {
	left  int64
	until int64
}

// quotas are the quotas a plugin instance (one per VM, one VM per Envoy
// worker) holds, by the descriptor's precheck key. A quota's units were
// debited in the control plane's store before it was granted, so spending
// them admits nothing the global limit refuses; a quota lost (a VM that
// stops, an answer that times out) can only admit less.
type quotas struct {
	m       map[string]*quota // entries are changed in place: a key is stored once, copied
	allowed uint32            // MetricQuotaAllowed's id
	defined bool
}

// wallNow returns the wall clock in Unix nanoseconds, to convert a quota's
// valid_until to the monotonic clock.
func (p *Plugin) wallNow() int64 { return p.host.WallNow() }

// spendQuota admits the request of s from the quotas when every one of its
// descriptors holds a quota for it (cost 1, still valid): it takes one from
// each and answers true. Otherwise it changes nothing.
func (p *Plugin) spendQuota(s *stream, now int64) bool {
	q := &p.quotas
	if len(q.m) == 0 {
		return false
	}
	descs := p.descs.Descriptors
	for i := range descs {
		e, ok := q.m[bufString(s.key(i))]
		if !ok || descs[i].HitsAddend != 1 || e.left < 1 || now >= e.until {
			return false
		}
	}
	for i := range descs {
		k := bufString(s.key(i))
		if e := q.m[k]; e.left > 1 {
			e.left--
		} else {
			delete(q.m, k)
		}
	}
	p.countQuota()
	return true
}

// quotaCovers reports whether a quota covers a request of cost for the
// descriptor key: the control plane granted it in advance, so the precheck
// must not reject it (that could only admit less than the limit).
func (p *Plugin) quotaCovers(key []byte, cost uint32, now int64) bool {
	if len(p.quotas.m) == 0 || cost != 1 {
		return false
	}
	e, ok := p.quotas.m[bufString(key)]
	return ok && e.left >= 1 && now < e.until
}

// countQuota counts one request admitted from quotas.
func (p *Plugin) countQuota() {
	q := &p.quotas
	if !q.defined {
		id, err := p.host.DefineCounter(MetricQuotaAllowed)
		if err != nil {
			p.warn("sluice: cannot define metric " + MetricQuotaAllowed + ": " + err.Error())
		}
		q.allowed, q.defined = id, true
	}
	p.count(q.allowed)
}

// recordQuotas keeps the quotas of an allowed answer (in p.resp) for the
// descriptors of s. The request answered takes one unit of each, as the
// field's contract says. A quota adds to what the descriptor still holds
// (several calls may have been under way at once, each granted a share),
// and the sum ends with the earlier of the two.
func (p *Plugin) recordQuotas(s *stream, now int64) {
	resp := &p.resp
	if len(resp.Statuses) != len(s.costs) {
		return
	}
	var wall int64
	for i := range resp.Statuses {
		qt := &resp.Statuses[i].Quota
		if qt.Requests < 2 || qt.ValidUntil == 0 || resp.Statuses[i].Code != rlsproto.CodeOK || s.costs[i] != 1 {
			continue
		}
		if wall == 0 {
			wall = p.wallNow()
		}
		valid := qt.ValidUntil - wall
		if valid <= 0 {
			continue
		}
		until := now + valid // valid_until on the monotonic clock
		if p.quotas.m == nil {
			p.quotas.m = make(map[string]*quota)
		}
		if e, ok := p.quotas.m[bufString(s.key(i))]; ok {
			if e.left > 0 && now < e.until {
				e.left, e.until = e.left+int64(qt.Requests)-1, min(e.until, until)
			} else {
				e.left, e.until = int64(qt.Requests)-1, until
			}
			continue
		}
		if len(p.quotas.m) >= maxQuotas {
			p.dropExpiredQuotas(now)
			if len(p.quotas.m) >= maxQuotas {
				continue
			}
		}
		p.quotas.m[string(s.key(i))] = &quota{left: int64(qt.Requests) - 1, until: until}
	}
}

// dropExpiredQuotas forgets the quotas that can no longer be spent.
func (p *Plugin) dropExpiredQuotas(now int64) {
	for k, e := range p.quotas.m {
		if now >= e.until || e.left < 1 {
			delete(p.quotas.m, k)
		}
	}
}
