package plugin

import (
	"github.com/sluicehq/sluice/filter/core/descriptors"
	"github.com/sluicehq/sluice/filter/core/rlsproto"
	"github.com/sluicehq/sluice/filter/proxywasm/shareddata"
)

// MetricQuotaAllowed counts requests admitted from a quota the control plane
// granted in advance (RLS DescriptorStatus.quota), without a call.
const MetricQuotaAllowed = "sluice.quota_allowed"

// Metrics of the leases the VMs of one proxy share (shareddata.Leases).
const (
	// MetricLeaseCASRetries counts the writes of a lease pool that lost
	// the compare-and-swap to another VM's and tried again.
	MetricLeaseCASRetries = "sluice.lease_cas_retries"
	// MetricLeaseExhausted counts the requests that found a unit in the
	// pool but lost every attempt to take it, and called the control plane.
	MetricLeaseExhausted = "sluice.lease_exhausted"
	// MetricLeaseLost counts the grants (and units given back) that could
	// not be stored in the pool: lost, which can only admit less.
	MetricLeaseLost = "sluice.lease_lost"
	// MetricLeaseWaited counts the requests that found their pool empty
	// and waited for the call of another request of the VM for the same
	// descriptors instead of calling (wait.go).
	MetricLeaseWaited = "sluice.lease_waited"
)

// quotas are the quotas the control plane granted (leases), kept in the
// proxy's shared data as one pool per descriptor for all its VMs
// (shareddata.Leases). A quota's units were debited in the control
// plane's store before it was granted, so spending them admits nothing the
// global limit refuses; a unit lost (a VM that stops, an answer that times
// out, a slot overwritten) can only admit less.
//
// A VM reads the pools only once a VM of the proxy has received a lease
// (seen: itself, or another that announced it, read when the plugin is
// configured and on the tick): with no lease-enabled policy, requests make
// no more host calls than without leases; until then, a VM calls out as
// before.
type quotas struct {
	pool    *shareddata.Leases
	seen    bool
	untils  []int64 // scratch: the expiry of each unit a request took
	lefts   []int64 // scratch: the units left in each pool after the take
	allowed uint32  // MetricQuotaAllowed's id
	defined bool
	// The ids of the lease metrics, and the pool's counts last reported.
	retriesID, exhaustedID, lostID, waitedID uint32
	retries, exhausted, lost                 int
}

// wallNow returns the wall clock in Unix nanoseconds, to convert a quota's
// valid_until to the monotonic clock.
func (p *Plugin) wallNow() int64 { return p.host.WallNow() }

// spendQuota admits the request of s from the pools when every one of its
// descriptors holds a unit for it (cost 1, still valid): it takes one from
// each (one read and one CAS write per descriptor when nobody else writes
// the slot) and answers true. Otherwise it changes nothing: units taken
// before a descriptor without one are given back.
func (p *Plugin) spendQuota(s *stream, now int64) bool {
	q := &p.quotas
	if !q.seen {
		return false
	}
	descs := p.descs.Descriptors
	for i := range descs {
		if descs[i].HitsAddend != 1 || descs[i].Usage {
			return false // leases are requests of cost 1; usage-based limits use none
		}
	}
	return p.takeQuota(s, len(descs), now, true)
}

// takeQuota is spendQuota for the n descriptors of s, each of cost 1;
// fresh says that p.descs holds them (the request being decided), for
// prefetch (noteTake).
func (p *Plugin) takeQuota(s *stream, n int, now int64, fresh bool) bool {
	q := &p.quotas
	q.untils, q.lefts = q.untils[:0], q.lefts[:0]
	for i := range n {
		until, ok, err := q.pool.Take(s.key(i), now)
		if err != nil {
			p.warn("sluice: cannot take a unit of a shared lease: " + err.Error())
		}
		if !ok {
			for j, u := range q.untils {
				if _, err := q.pool.Give(s.key(j), 1, u, now); err != nil {
					p.warn("sluice: cannot give back a unit of a shared lease: " + err.Error())
				}
			}
			p.reportLeases()
			return false
		}
		q.untils, q.lefts = append(q.untils, until), append(q.lefts, q.pool.TookLeft)
	}
	p.countQuota()
	p.reportLeases()
	if p.renew.on {
		for i := range n {
			var one []descriptors.Descriptor
			if fresh {
				one = p.descs.Descriptors[i : i+1]
			}
			p.noteTake(s.key(i), one, q.lefts[i], q.untils[i], now)
		}
	}
	return true
}

// quotaCovers reports whether a quota covers the request's descriptor d,
// whose key is key: the control plane granted it in advance, so the
// precheck must not reject it (that could only admit less than the limit).
// One read of the shared data, made only when the precheck would reject.
// A usage-based descriptor uses no quota.
func (p *Plugin) quotaCovers(key []byte, d *descriptors.Descriptor, now int64) bool {
	q := &p.quotas
	return q.seen && d.HitsAddend == 1 && !d.Usage && q.pool.Covers(key, now)
}

// countQuota counts one request admitted from quotas.
func (p *Plugin) countQuota() {
	p.defineQuotaMetrics()
	p.count(p.quotas.allowed)
}

// defineQuotaMetrics defines the quota and lease metrics, once: the first
// time one counts.
func (p *Plugin) defineQuotaMetrics() {
	q := &p.quotas
	if q.defined {
		return
	}
	q.allowed = p.defineCounter(MetricQuotaAllowed)
	q.retriesID = p.defineCounter(MetricLeaseCASRetries)
	q.exhaustedID = p.defineCounter(MetricLeaseExhausted)
	q.lostID = p.defineCounter(MetricLeaseLost)
	q.waitedID = p.defineCounter(MetricLeaseWaited)
	q.defined = true
}

// defineCounter defines counter name; a failure is logged (the counter
// then counts nowhere).
func (p *Plugin) defineCounter(name string) uint32 {
	id, err := p.host.DefineCounter(name)
	if err != nil {
		p.warn("sluice: cannot define metric " + name + ": " + err.Error())
	}
	return id
}

// reportLeases adds the growth of the pool's counts to the lease metrics
// (no host call when none grew).
func (p *Plugin) reportLeases() {
	q := &p.quotas
	pl := q.pool
	if pl.Retries == q.retries && pl.Exhausted == q.exhausted && pl.Lost == q.lost {
		return
	}
	p.defineQuotaMetrics()
	for _, c := range []struct {
		id       uint32
		now, was int
	}{{q.retriesID, pl.Retries, q.retries}, {q.exhaustedID, pl.Exhausted, q.exhausted}, {q.lostID, pl.Lost, q.lost}} {
		if c.now > c.was {
			p.host.IncrementCounter(c.id, int64(c.now-c.was))
		}
	}
	q.retries, q.exhausted, q.lost = pl.Retries, pl.Exhausted, pl.Lost
}

// recordQuotas puts the quotas of an allowed answer (in p.resp) for the
// descriptors of s into the proxy's pools. The request answered takes one
// unit of each, as the field's contract says. A quota adds to what the
// descriptor's pool still holds (several calls, from any VM, may have been
// under way at once, each granted a share), and the sum ends with the
// earlier of the two.
func (p *Plugin) recordQuotas(s *stream, now int64) {
	resp := &p.resp
	if len(resp.Statuses) != len(s.costs) || p.quotas.pool == nil {
		return
	}
	var wall int64
	for i := range resp.Statuses {
		qt := &resp.Statuses[i].Quota
		if qt.Requests < 2 || qt.ValidUntil == 0 || resp.Statuses[i].Code != rlsproto.CodeOK || s.costs[i] != 1 ||
			p.cfg.RateLimits[s.rateLimits[i]].Usage != nil {
			continue
		}
		if wall == 0 {
			wall = p.wallNow()
		}
		valid := qt.ValidUntil - wall
		if valid <= 0 {
			continue
		}
		if !p.quotas.seen {
			p.quotas.seen = true
			if err := p.quotas.pool.Announce(); err != nil {
				p.warn("sluice: cannot tell the other VMs about leases: " + err.Error())
			}
		}
		// valid_until on the monotonic clock, which every VM of the proxy
		// reads alike
		if _, err := p.quotas.pool.Grant(s.key(i), int64(qt.Requests)-1, now+valid, now); err != nil {
			p.warn("sluice: cannot share a lease with the other VMs: " + err.Error())
		}
	}
	p.reportLeases()
}
