package core

import (
	"github.com/sluicehq/sluice/filter/core/descriptors"
	"github.com/sluicehq/sluice/filter/core/precheck"
)

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
func (w *Worker) checkShared(x *Exchange, descs []descriptors.Descriptor, now int64) (action Action, rejected bool) {
	c := &w.checks
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
		if v := c.table.Check(key, descs[i].PrecheckCost(), now); v.Reject && !w.leases.covers(key, &descs[i], now) {
			c.count(mPrecheckShared)
			return c.reject(x, &w.replies, descs[i].RateLimit, v), true
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
