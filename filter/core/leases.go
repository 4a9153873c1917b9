package core

import (
	"github.com/sluicehq/sluice/filter/core/descriptors"
	"github.com/sluicehq/sluice/filter/core/lease"
	"github.com/sluicehq/sluice/filter/core/rlsproto"
)

// leaser is the lease stage: the quotas the control plane granted in
// advance (leases), kept as one pool per descriptor for all the workers of
// the proxy (lease.Pools). A quota's units were debited in the control
// plane's store before it was granted, so spending them admits nothing the
// global limit refuses; a unit lost (a worker that stops, an answer that
// times out, a pool overwritten) can only admit less.
//
// A worker reads the pools only once a worker of the proxy has received a
// lease (seen: itself, or another that announced it, read when the worker
// is configured and on the tick): with no lease-enabled policy, requests
// make no more host calls than without leases; until then, a worker calls
// out as before.
type leaser struct {
	*env
	w     *Worker
	pools lease.Pools
	seen  bool
	// took is what the last Take read of a pool (for the wait stage and
	// prefetch).
	took   lease.Took
	untils []int64 // scratch: the expiry of each unit a request took
	lefts  []int64 // scratch: the units left in each pool after the take
	// The pools' contention counts last reported as metrics.
	retries, exhausted, lost int
	// Requests waiting for a call under way (wait.go), and those calls by
	// their descriptors' precheck keys.
	waiting []*Exchange
	asking  map[string]*Exchange
	// renew renews the lease pools before they run out (renew.go).
	renew *renewals
	// noQuota holds the keys whose grant was lost to another key's live
	// pool in their slot, until when their requests ask for no quota.
	noQuota map[string]int64
}

// maxNoQuota bounds leaser.noQuota: past it, the oldest goes.
const maxNoQuota = 64

// newLeaser returns the lease stage of w's configuration over pools.
func newLeaser(w *Worker, pools lease.Pools) leaser {
	l := leaser{env: &w.env, w: w, pools: pools}
	// A worker that starts after another received a lease (a reload after
	// a trap, a new worker) reads the pools at once, not from its first
	// tick: a lease lasts about as long as the tick period, and one that a
	// trapped worker left would otherwise expire unspent.
	l.seen = pools.Announced()
	l.renew = newRenewals(w, pools)
	return l
}

// spend admits the request of x from the pools when every one of its
// descriptors descs holds a unit for it (cost 1, still valid): it takes one
// from each and answers true. Otherwise it changes nothing: units taken
// before a descriptor without one are given back.
func (l *leaser) spend(x *Exchange, descs []descriptors.Descriptor, now int64) bool {
	l.took = lease.Took{}
	if !l.seen {
		return false
	}
	if len(l.noQuota) != 0 {
		l.markNoQuota(x, descs, now)
	}
	for i := range descs {
		if descs[i].HitsAddend != 1 || descs[i].Usage {
			return false // leases are requests of cost 1; usage-based limits use none
		}
	}
	return l.take(x, len(descs), true, now)
}

// take is spend for the n descriptors of x, each of cost 1; fresh says
// that x is the request being decided (prefetch keeps track of its keys).
func (l *leaser) take(x *Exchange, n int, fresh bool, now int64) bool {
	l.untils, l.lefts = l.untils[:0], l.lefts[:0]
	for i := range n {
		took, err := l.pools.Take(x.key(i), now)
		l.took = took
		l.warnErr("cannot take a unit of a shared lease", err)
		if !took.OK {
			for j, u := range l.untils {
				_, err := l.pools.Give(x.key(j), 1, u, now)
				l.warnErr("cannot give back a unit of a shared lease", err)
			}
			if fresh && n == 1 && took.Recent {
				// a renewal, if one can be made, is the call for the
				// request to wait for (wait.go)
				l.renew.r.RenewEnded(x.key(0), took.Until, now)
			}
			l.report()
			return false
		}
		l.untils, l.lefts = append(l.untils, took.Until), append(l.lefts, took.Left)
	}
	l.define(mQuotaAllowed, mLeaseWaited)
	l.count(mQuotaAllowed)
	l.report()
	if l.renew.r.On {
		for i := range n {
			l.renew.r.NoteTake(x.key(i), fresh, l.lefts[i], l.untils[i], now)
		}
	}
	return true
}

// markNoQuota marks the descriptors of x whose grants were lost lately
// (lostGrant): x's call asks for no quota for them.
func (l *leaser) markNoQuota(x *Exchange, descs []descriptors.Descriptor, now int64) {
	for i := range descs {
		if until, ok := l.noQuota[string(x.key(i))]; ok {
			if now < until {
				descs[i].NoQuota = true
			} else {
				delete(l.noQuota, string(x.key(i)))
			}
		}
	}
}

// lostGrant is told that key's grant was lost to another key's live pool
// in its slot (two keys in one slot): for lease.Recent its requests ask
// for no quota. The control plane would hand each of their calls another
// share, lost the same way; their limit is then decided per request,
// exactly, until the other key's pool ends.
func (l *leaser) lostGrant(key []byte, now int64) {
	if l.noQuota == nil {
		l.noQuota = make(map[string]int64)
	}
	if len(l.noQuota) >= maxNoQuota {
		oldest, first := "", true
		for k, until := range l.noQuota {
			if first || until < l.noQuota[oldest] {
				oldest, first = k, false
			}
		}
		delete(l.noQuota, oldest)
	}
	l.noQuota[string(key)] = now + lease.Recent
}

// covers reports whether a quota covers the request's descriptor d, whose
// key is key: the control plane granted it in advance, so the precheck
// must not reject it (that could only admit less than the limit). Asked
// only when the precheck would reject. A usage-based descriptor uses no
// quota.
func (l *leaser) covers(key []byte, d *descriptors.Descriptor, now int64) bool {
	return l.seen && d.HitsAddend == 1 && !d.Usage && l.pools.Covers(key, now)
}

// report adds the growth of the pools' contention counts to the lease
// metrics (no host call when none grew).
func (l *leaser) report() {
	retries, exhausted, lost := l.pools.Contention()
	if retries == l.retries && exhausted == l.exhausted && lost == l.lost {
		return
	}
	l.define(mQuotaAllowed, mLeaseWaited)
	for _, c := range []struct {
		m        metric
		now, was int
	}{{mLeaseRetries, retries, l.retries}, {mLeaseExhausted, exhausted, l.exhausted}, {mLeaseLost, lost, l.lost}} {
		if c.now > c.was {
			l.add(c.m, int64(c.now-c.was))
		}
	}
	l.retries, l.exhausted, l.lost = retries, exhausted, lost
}

// announce makes the pools seen, and tells the other workers.
func (l *leaser) announce() {
	if l.seen {
		return
	}
	l.seen = true
	l.warnErr("cannot tell the other workers about leases", l.pools.Announce())
}

// recordQuotas puts the quotas of an allowed answer resp for the
// descriptors of x into the proxy's pools. The request answered takes one
// unit of each, as the field's contract says. A quota adds to what the
// descriptor's pool still holds (several calls, from any worker, may have
// been under way at once, each granted a share), and the sum ends with the
// earlier of the two.
func (l *leaser) recordQuotas(x *Exchange, resp *rlsproto.Response, now int64) {
	if len(resp.Statuses) != len(x.costs) {
		return
	}
	var wall int64
	for i := range resp.Statuses {
		qt := &resp.Statuses[i].Quota
		if qt.Requests < 2 || qt.ValidUntil == 0 || resp.Statuses[i].Code != rlsproto.CodeOK || x.costs[i] != 1 ||
			l.cfg.RateLimits[x.rateLimits[i]].Usage != nil {
			continue
		}
		if wall == 0 {
			wall = l.host.WallNow()
		}
		valid := qt.ValidUntil - wall
		if valid <= 0 {
			continue
		}
		l.announce()
		// valid_until on the monotonic clock, which every worker of the
		// proxy reads alike
		ok, err := l.pools.Grant(x.key(i), int64(qt.Requests)-1, now+valid, now)
		l.warnErr("cannot share a lease with the other workers", err)
		if !ok && err == nil {
			l.lostGrant(x.key(i), now)
		}
	}
	l.report()
}

// answerHasQuota reports whether an admitted answer grants a quota that
// recordQuotas may take in.
func answerHasQuota(resp *rlsproto.Response) bool {
	for i := range resp.Statuses {
		if qt := &resp.Statuses[i].Quota; qt.Requests >= 2 && qt.ValidUntil != 0 {
			return true
		}
	}
	return false
}

// tick reads the per-Envoy pools' state: whether leases are in use, and
// the seed that names the proxy.
func (l *leaser) tick() {
	if l.seen {
		l.pools.Refresh() // two workers that set a seed at once converge
	} else {
		l.seen = l.pools.Announced()
	}
}
