package core

import (
	"github.com/sluicehq/sluice/filter/core/descriptors"
	"github.com/sluicehq/sluice/filter/core/limitheaders"
	"github.com/sluicehq/sluice/filter/core/precheck"
	"github.com/sluicehq/sluice/filter/core/rlsproto"
)

// checker is the precheck stage: what the control plane said about each
// descriptor (package precheck's table), which rejects locally what it
// would certainly reject, and the over-limit blocks the workers of the
// proxy share (Blocks). The table also remembers the descriptors' failure
// modes, so it is kept with the precheck off too.
type checker struct {
	*env
	table *precheck.Table
	on    bool // the precheck is on
	// blocks is the per-Envoy blocks (blocks.go); nil with the precheck or
	// shared_state off.
	blocks Blocks
	// The blocks' contention counts last reported as metrics.
	retries, lost int
	// freed is the proxy's freed mark last seen (Blocks.Freed); refunds
	// says whether a rate limit refunds (only refunds free keys).
	freed   uint64
	refunds bool
}

// newChecker returns the precheck stage of e's configuration.
func newChecker(e *env) checker {
	cfg := e.cfg
	c := checker{env: e, table: precheck.NewTable(cfg.Precheck.MaxEntries, cfg.Timeout), on: cfg.Precheck.Enabled}
	if c.on && cfg.SharedState {
		c.blocks = e.host.Blocks(cfg.Domain)
	}
	for i := range cfg.RateLimits {
		if u := cfg.RateLimits[i].Usage; u != nil && u.Refund {
			c.refunds = true
		}
	}
	return c
}

// reject answers 429 for a request the precheck rejected on its
// descriptor of rate limit rateLimit.
func (c *checker) reject(x *Exchange, r *replies, rateLimit int, v precheck.Verdict) Action {
	c.count(mPrecheckRejected)
	// The reply's headers: the last rejection's, most often (a flood).
	headers := r.cache.headers
	if secs := limitheaders.Seconds(v.RetryAfter); !r.cache.holds(rateLimit, v, secs) {
		headers = r.buildPrecheck(rateLimit, v, secs)
	}
	if err := x.stream.SendLocalReply(429, DetailsPrecheck, bodyOverLimit, headers); err != nil {
		c.warn("sluice: cannot send the local reply: " + err.Error())
		return Continue
	}
	return Pause
}

// record tells the precheck what the control plane's answer resp said
// about each descriptor of a call s, at now; a denial that blocks is
// shared with the other workers.
func (c *checker) record(s *sent, resp *rlsproto.Response, now int64) {
	admitted := resp.OverallCode == rlsproto.CodeOK
	for i := range s.costs {
		lim, hasLimit := descriptorLimit(resp, i)
		o := precheck.Outcome{Cost: s.costs[i], Limit: lim, HasLimit: hasLimit, Admitted: admitted, SentAt: s.sentAt,
			Name: limitName(resp, i), FailureMode: descriptorFailureMode(resp, i)}
		// An over-limit descriptor in an answer that admits the request is
		// in quota mode (over, but not every quota descriptor is): the same
		// request would be admitted again, so it must not block.
		if resp.Statuses[i].Code == rlsproto.CodeOverLimit && !admitted {
			o.OverLimit, o.RetryAfter = true, descriptorRetryAfter(resp, i)
		}
		c.table.Record(s.key(i), o, now)
		if o.OverLimit && c.blocks != nil {
			c.publish(s.key(i), o, now)
		}
	}
}

// recordAdmitted tells the precheck what the admitted answer resp said
// about each descriptor of s, without the time the answer arrived
// (precheck.Table.RecordAdmitted: the charges wait for the table's next
// call given a time, which comes later). It returns false, recording
// nothing, when the charges cannot wait: the caller then reads the time
// and calls record.
func (c *checker) recordAdmitted(s *sent, resp *rlsproto.Response) bool {
	if len(resp.Statuses) != len(s.costs) {
		return true
	}
	if c.table.Deferred()+len(s.costs) > precheck.MaxDeferred {
		return false
	}
	for i := range s.costs {
		lim, hasLimit := descriptorLimit(resp, i)
		c.table.RecordAdmitted(s.key(i), precheck.Outcome{Cost: s.costs[i], Limit: lim, HasLimit: hasLimit,
			Admitted: true, SentAt: s.sentAt, Name: limitName(resp, i), FailureMode: descriptorFailureMode(resp, i)})
	}
	return true
}

// learnBlock blocks descriptor key as outcome o (a denial) teaches, and
// shares the block: for a denial heard outside a request's call (a
// settlement's answer).
func (c *checker) learnBlock(key []byte, o precheck.Outcome, now int64) {
	b, ok := precheck.BlockOf(o, now)
	if !ok {
		return
	}
	c.table.Import(key, b, now)
	if c.blocks != nil {
		c.publish(key, o, now)
	}
}

// unblock ends the block of descriptor key, here and in the proxy: a
// refund freed it.
func (c *checker) unblock(key []byte, now int64) {
	c.table.Unblock(key)
	if c.blocks != nil {
		c.blocks.Unblock(key, now)
	}
}

// thawed reports, for a request the table rejects on descriptor key at
// cost, whether the rejection no longer holds because another worker freed
// a key since this one last looked (Blocks.Freed): the table's blocks are
// then dropped (those still shared come back as requests meet them), and
// the key checked again.
func (c *checker) thawed(key []byte, cost, now int64) bool {
	if c.blocks == nil || !c.refunds {
		return false
	}
	mark := c.blocks.Freed(now)
	if mark == c.freed {
		return false
	}
	c.freed = mark
	if c.table.DropBlocks(now) == 0 {
		return false
	}
	return !c.table.Check(key, cost, now).Reject
}

// failureMode returns the failure mode the control plane last reported
// for the descriptors of s: closed if any fails closed, else open if any
// fails open, else precheck.FailureUnknown.
func (c *checker) failureMode(s *sent) precheck.FailureMode {
	mode := precheck.FailureUnknown
	for i := range s.keyEnds {
		switch c.table.FailureMode(s.key(i)) {
		case precheck.FailureClosed:
			return precheck.FailureClosed
		case precheck.FailureOpen:
			mode = precheck.FailureOpen
		}
	}
	return mode
}

// checkShared rejects locally a request that the worker's own precheck let
// through but that a block another worker shared refuses: for each
// descriptor, one Lookup (made only when the request would otherwise call
// the control plane), and a block found goes into the table, which decides
// as it would on a block of its own, so the worker's next requests of that
// descriptor are decided with no lookup at all. rejected reports that the
// request got its 429.
//
// When no block is live in the proxy (Blocks.MayHold), nothing is looked
// up.
func (c *checker) checkShared(x *Exchange, descs []descriptors.Descriptor, leases *leaser, r *replies, now int64) (action Action, rejected bool) {
	if !c.blocks.MayHold(now) {
		return 0, false
	}
	for i := range descs {
		key := x.key(i)
		b, ok := c.blocks.Lookup(key, now)
		if !ok {
			continue
		}
		c.table.Import(key, b, now)
		if v := c.table.Check(key, descs[i].PrecheckCost(), now); v.Reject && !leases.covers(key, &descs[i], now) &&
			!c.thawed(key, descs[i].PrecheckCost(), now) {
			c.count(mPrecheckShared)
			return c.reject(x, r, descs[i].RateLimit, v), true
		}
	}
	return 0, false
}

// publish shares the block a denial o of descriptor key teaches, when it
// blocks at all here (a denial close to its reset does not, and most of a
// flood's calls to the control plane are those). A block every attempt
// failed to share stays in this worker's table only.
func (c *checker) publish(key []byte, o precheck.Outcome, now int64) {
	b, ok := precheck.BlockOf(o, now)
	if !ok || !c.table.Blocks(b, now) {
		return
	}
	_, err := c.blocks.Publish(key, b, now)
	retries, lost := c.blocks.Contention()
	if n := retries - c.retries; n > 0 {
		c.add(mSharedRetries, int64(n))
	}
	if lost > c.lost {
		c.count(mSharedLost)
	}
	c.retries, c.lost = retries, lost
	c.warnErr("cannot share an over-limit block with the other workers", err)
}
