package plugin

import "github.com/sluicehq/sluice/filter/core/precheck"

// Metrics of the over-limit blocks the VMs of one proxy share (package
// sharedblocks).
const (
	// MetricPrecheckShared counts the precheck's rejections on a block read
	// from the shared data, that this VM had not learnt itself (they count
	// in sluice.precheck_rejected too).
	MetricPrecheckShared = "sluice.precheck_shared"
	// MetricSharedCASRetries counts the writes of a block that lost the
	// compare-and-swap to another VM's and tried again.
	MetricSharedCASRetries = "sluice.shared_cas_retries"
	// MetricSharedLost counts the blocks that stayed in this VM: every
	// attempt to share one lost, or the host refused it.
	MetricSharedLost = "sluice.shared_lost"
)

// checkShared rejects locally a request that the VM's own precheck let
// through but that a block another VM shared refuses: for each descriptor,
// one read of the shared data (made only when the request would otherwise
// call the control plane), and a block found goes into the table, which
// decides as it would on a block of its own, so the VM's next requests of
// that descriptor are decided with no host call at all. rejected reports
// that the request got its 429.
//
// When no block is live in the proxy, as far as the VM read the proxy's
// live mark at most shareddata.LiveRefresh ago, no slot is read: a block
// another VM publishes is used here from at most LiveRefresh after.
func (p *Plugin) checkShared(s *stream, now int64) (action uint32, rejected bool) {
	if !p.shared.MayHold(now) {
		return 0, false
	}
	descs := p.descs.Descriptors
	for i := range descs {
		key := s.key(i)
		b, ok := p.shared.Lookup(key, now)
		if !ok {
			continue
		}
		p.table.Import(key, b, now)
		if v := p.table.Check(key, descs[i].PrecheckCost(), now); v.Reject && !p.quotaCovers(key, &descs[i], now) {
			p.count(p.metrics.precheckRejected)
			p.count(p.metrics.precheckShared)
			return p.rejectLocally(s, descs[i].RateLimit, v), true
		}
	}
	return 0, false
}

// publish shares the block a denial o of descriptor key teaches, when it
// blocks at all here (a denial close to its reset does not, and most of a
// flood's calls to the control plane are those). A block every attempt
// failed to share stays in this VM's table only.
func (p *Plugin) publish(key []byte, o precheck.Outcome, now int64) {
	b, ok := precheck.BlockOf(o, now)
	if !ok || !p.table.Blocks(b, now) {
		return
	}
	sh := p.shared
	retries, lost := sh.Retries, sh.Lost
	_, err := sh.Publish(key, b, now)
	if n := sh.Retries - retries; n > 0 {
		p.host.IncrementCounter(p.metrics.sharedRetries, int64(n))
	}
	if sh.Lost > lost {
		p.count(p.metrics.sharedLost)
	}
	if err != nil {
		p.warn("sluice: cannot share an over-limit block with the other VMs: " + err.Error())
	}
}
