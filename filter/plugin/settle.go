package plugin

import (
	"math/rand/v2"
	"strconv"
	"unsafe"

	"github.com/sluicehq/sluice/filter/core/config"
	"github.com/sluicehq/sluice/filter/core/descriptors"
	"github.com/sluicehq/sluice/filter/core/headermap"
	"github.com/sluicehq/sluice/filter/core/precheck"
	"github.com/sluicehq/sluice/filter/core/rlsproto"
)

// Settlements: the charges of usage-based limits (usage.go), sent to the
// control plane as ShouldRateLimit calls with the x-sluice-settle header
// (the settlement contract, v1).
//
// Each plugin instance (one per VM and filter configuration) keeps a
// bounded queue. A charge waits in it, merged with the waiting charges of
// the same descriptor (the domain is the plugin's, so the key is the
// descriptor), until a batch forms: batch_max charges are waiting, or the
// oldest has waited interval_ms (with interval_ms 0, at once). A batch gets
// a token, <8 random hex digits of the VM>-<the VM's sequence number>, and
// is frozen: it is sent as one call and, until the control plane
// acknowledges it (gRPC OK with a decodable answer), sent again with the
// same token and the same descriptors in the same order, backing off from
// 100ms to 10s, so that the control plane applies each (token, descriptor
// index) once. An acknowledged batch is dropped and never sent again.
//
// Bounds: at most queue_max charges wait, and at most queue_max charges are
// in batches (in flight or waiting to be sent again); a charge that finds
// the waiting queue full (and no waiting charge of its descriptor to merge
// into) is dropped and counted in sluice.usage_settle_lost, as is one whose
// descriptor key is longer than maxSettleKey. So one plugin instance holds
// at most 2 × queue_max charges, each a key of at most maxSettleKey bytes
// (one copy, shared by the queue and the batch) and under 100 bytes of
// bookkeeping (the queue's entry and index, the batch's key and charge):
// at most 2 × 4096 × (1024 + 100) bytes, about 9.2 MB, with the defaults
// and the longest keys; with keys of tens of bytes, about 1 MB. The
// scratch of one call (its descriptors and body) is under 70 KB.
//
// The tick: while charges wait or batches are unacknowledged, the tick
// period is shortened to the next thing due (a batch forming, a retry, a
// call overdue); with none, it goes back to tickPeriodMs, so an idle
// filter ticks no more than without usage-based limits.
//
// The answers teach the precheck: a descriptor answered OVER_LIMIT with a
// duration_until_reset means that a request of cost 1 would be refused
// until then, which is exactly what a request-time check of cost 1 (or a
// probe, cost 0) asks: the key is blocked in the precheck table, and
// shared with the other VMs (package sharedblocks), as for an over-limit
// answer at request time, with the same margins (the block ends the call
// timeout before the reset counted from when the settle call was sent).

// Metric names of settlements.
const (
	MetricUsageSettled       = "sluice.usage_settled"        // charges the control plane acknowledged
	MetricUsageSettleCalls   = "sluice.usage_settle_calls"   // settle calls acknowledged
	MetricUsageSettleRetries = "sluice.usage_settle_retries" // settle calls sent again after a failure
	MetricUsageSettleLost    = "sluice.usage_settle_lost"    // charges dropped: the queue was full, or the key too long
)

const (
	// maxSettleKey is the longest descriptor key (package descriptors'
	// encoding) a charge may have; a longer one is lost.
	maxSettleKey = 1024
	// settleBackoffMin and settleBackoffMax bound the wait before a failed
	// batch is sent again (doubling from the first to the second).
	settleBackoffMin = 100 * config.Millisecond
	settleBackoffMax = 10 * config.Second
)

// tokenSource makes the batch tokens of one VM.
type tokenSource struct {
	prefix string // 8 random hex digits
	seq    uint64
}

func newTokenSource() *tokenSource {
	const hex = "0123456789abcdef"
	var b [8]byte
	r := rand.Uint32()
	for i := range b {
		b[i] = hex[r>>(28-4*i)&0xf]
	}
	return &tokenSource{prefix: string(b[:])}
}

// next returns a new token.
func (t *tokenSource) next() string {
	t.seq++
	return t.prefix + "-" + strconv.FormatUint(t.seq, 10)
}

// pendingCharge is a charge waiting for a batch.
type pendingCharge struct {
	key    string // descriptor key (descriptors.AppendKey)
	charge uint64
}

// settleBatch is a frozen batch: sent, or waiting to be sent (again).
type settleBatch struct {
	token    string
	keys     []string
	charges  []uint64
	inFlight bool
	callID   uint32
	sentAt   int64
	retryAt  int64 // when it may be sent again
	attempts int   // failed sends
}

// settler is a plugin instance's settlement queue.
type settler struct {
	cfg       config.Settle
	tokens    *tokenSource
	pending   []pendingCharge // waiting, oldest first
	index     map[string]int  // key -> index in pending
	since     int64           // when the oldest waiting charge arrived
	batches   []*settleBatch  // oldest first
	inBatches int             // charges in batches
	calls     map[uint32]*settleBatch
	headers   [][2]string // of a settle call, less the token
	// Metric ids.
	settledID, callsID, retriesID, lostID uint32
	// Scratch.
	descs   []descriptors.Descriptor
	entries []descriptors.Entry
	bounds  []int
	hmap    []byte
	body    []byte
}

// configure sets the settler up for cfg (nothing when no rate limit is
// usage-based).
func (st *settler) configure(p *Plugin, cfg *config.Config, tokens *tokenSource) {
	*st = settler{}
	if !cfg.HasUsage() {
		return
	}
	st.cfg, st.tokens = cfg.Settle, tokens
	st.index, st.calls = map[string]int{}, map[uint32]*settleBatch{}
	st.headers = rlsproto.CallHeaders(cfg.Authority, int64(cfg.Settle.TimeoutMs)*config.Millisecond, [2]string{rlsproto.SettleHeader, ""})
	st.settledID = p.defineCounter(MetricUsageSettled)
	st.callsID = p.defineCounter(MetricUsageSettleCalls)
	st.retriesID = p.defineCounter(MetricUsageSettleRetries)
	st.lostID = p.defineCounter(MetricUsageSettleLost)
}

// add queues a charge for the descriptor key at now.
func (st *settler) add(p *Plugin, key []byte, charge uint64, now int64) {
	if len(key) > maxSettleKey {
		p.count(st.lostID)
		p.warn("sluice: a usage charge was lost: its descriptor key is longer than " + strconv.Itoa(maxSettleKey) + " bytes")
		return
	}
	if i, ok := st.index[string(key)]; ok {
		pc := &st.pending[i]
		pc.charge = min(pc.charge+charge, config.MaxCost) // both are at most MaxCost: no overflow
		return
	}
	if len(st.pending) >= st.cfg.QueueMax {
		p.count(st.lostID)
		p.warn("sluice: a usage charge was lost: " + strconv.Itoa(st.cfg.QueueMax) + " charges wait to be settled (settle.queue_max)")
		return
	}
	if len(st.pending) == 0 {
		st.since = now
	}
	k := string(key)
	st.index[k] = len(st.pending)
	st.pending = append(st.pending, pendingCharge{key: k, charge: charge})
}

// flush forms the batches that are due and sends those that may be sent.
func (st *settler) flush(p *Plugin, now int64) {
	if st.index == nil {
		return
	}
	taken := 0
	interval := int64(st.cfg.IntervalMs) * config.Millisecond
	for taken < len(st.pending) {
		rest := len(st.pending) - taken
		if rest < st.cfg.BatchMax && now-st.since < interval {
			break // neither full nor due
		}
		n := min(rest, st.cfg.BatchMax)
		if st.inBatches+n > st.cfg.QueueMax {
			break // wait for batches to be acknowledged
		}
		b := &settleBatch{token: st.tokens.next(), keys: make([]string, n), charges: make([]uint64, n)}
		for j, pc := range st.pending[taken : taken+n] {
			b.keys[j], b.charges[j] = pc.key, pc.charge
			delete(st.index, pc.key)
		}
		st.batches = append(st.batches, b)
		st.inBatches += n
		taken += n
	}
	if taken > 0 {
		left := copy(st.pending, st.pending[taken:])
		clear(st.pending[left:])
		st.pending = st.pending[:left]
		for i := range st.pending {
			st.index[st.pending[i].key] = i
		}
	}
	for _, b := range st.batches {
		if !b.inFlight && b.retryAt <= now {
			st.send(p, b, now)
		}
	}
}

// send sends batch b.
func (st *settler) send(p *Plugin, b *settleBatch, now int64) {
	st.entries, st.bounds = st.entries[:0], append(st.bounds[:0], 0)
	for _, k := range b.keys {
		st.entries, _ = descriptors.ParseKey(st.entries, k) // keys are AppendKey's
		st.bounds = append(st.bounds, len(st.entries))
	}
	st.descs = st.descs[:0]
	for i := range b.keys {
		st.descs = append(st.descs, descriptors.Descriptor{Entries: st.entries[st.bounds[i]:st.bounds[i+1]]})
	}
	st.body = rlsproto.AppendSettleFrame(st.body[:0], p.cfg.Domain, st.descs, b.charges)
	st.headers[len(st.headers)-1][1] = b.token
	st.hmap = headermap.Append(st.hmap[:0], st.headers)
	if b.attempts > 0 {
		p.count(st.retriesID)
	}
	callID, err := p.host.HTTPCall(p.cfg.Cluster, st.hmap, st.body, uint32(st.cfg.TimeoutMs))
	if err != nil {
		st.failed(p, b, now, "cannot call the control plane (cluster "+p.cfg.Cluster+"): "+err.Error())
		return
	}
	b.inFlight, b.callID, b.sentAt = true, callID, now
	st.calls[callID] = b
}

// failed schedules batch b to be sent again, with the same token.
func (st *settler) failed(p *Plugin, b *settleBatch, now int64, reason string) {
	if b.inFlight {
		delete(st.calls, b.callID)
		b.inFlight = false
	}
	b.attempts++
	backoff := settleBackoffMin << min(b.attempts-1, 7)
	b.retryAt = now + min(backoff, settleBackoffMax)
	p.warn("sluice: a settlement call failed, retrying with the same token " + b.token + ": " + reason)
}

// owns reports whether callID is an unanswered settle call.
func (st *settler) owns(callID uint32) bool {
	_, ok := st.calls[callID]
	return ok
}

// onAnswer takes the answer to settle call callID.
func (st *settler) onAnswer(p *Plugin, callID uint32, numHeaders, bodySize int) {
	b := st.calls[callID]
	now := p.host.Now()
	if reason, _ := p.readAnswer(numHeaders, bodySize); reason != "" {
		if numHeaders > 0 && refused(p.host) {
			// The control plane refuses the batch as malformed: sending it
			// again cannot help.
			st.remove(b)
			p.host.IncrementCounter(st.lostID, int64(len(b.keys)))
			p.warn("sluice: the control plane refused a settlement, its charges are lost: " + reason)
			st.flush(p, now)
		} else {
			st.failed(p, b, now, reason)
		}
		p.schedule(now)
		return
	}
	st.remove(b)
	p.host.IncrementCounter(st.settledID, int64(len(b.keys)))
	p.count(st.callsID)
	st.learn(p, b, now)
	st.flush(p, now) // room for waiting charges
	p.schedule(now)
}

// remove forgets batch b.
func (st *settler) remove(b *settleBatch) {
	delete(st.calls, b.callID)
	b.inFlight = false
	for i, x := range st.batches {
		if x == b {
			copy(st.batches[i:], st.batches[i+1:])
			st.batches[len(st.batches)-1] = nil
			st.batches = st.batches[:len(st.batches)-1]
			break
		}
	}
	st.inBatches -= len(b.keys)
}

// refused reports whether the answer being delivered is gRPC
// INVALID_ARGUMENT: the contract's answer to a malformed settle call.
func refused(h Host) bool {
	gs, ok := h.CallResponseTrailer("grpc-status")
	if !ok {
		gs, ok = h.CallResponseHeader("grpc-status")
	}
	return ok && gs == "3"
}

// learn blocks in the precheck the descriptors of acknowledged batch b that
// the answer in p.resp says are over their limit.
func (st *settler) learn(p *Plugin, b *settleBatch, now int64) {
	if !p.precheck {
		return
	}
	resp := &p.resp
	for i := range resp.Statuses {
		if i >= len(b.keys) || resp.Statuses[i].Code != rlsproto.CodeOverLimit {
			continue
		}
		retry := descriptorRetryAfter(resp, i)
		if resp.Statuses[i].HasReset {
			retry = max(resp.Statuses[i].DurationUntilReset, 0)
		}
		lim, hasLimit := descriptorLimit(resp, i)
		o := precheck.Outcome{Cost: 1, Limit: lim, HasLimit: hasLimit, OverLimit: true, RetryAfter: retry,
			SentAt: b.sentAt, Name: limitName(resp, i)}
		bl, ok := precheck.BlockOf(o, now)
		if !ok {
			continue
		}
		key := unsafe.Slice(unsafe.StringData(b.keys[i]), len(b.keys[i])) // read only
		p.table.Import(key, bl, now)
		if p.shared != nil {
			p.publish(key, o, now)
		}
	}
}

// tick gives up on the settle calls the proxy never answered and sends
// what is due.
func (st *settler) tick(p *Plugin, now int64) {
	if st.index == nil {
		return
	}
	limit := int64(st.cfg.TimeoutMs)*config.Millisecond + overdueGrace
	for _, b := range st.batches {
		if b.inFlight && now-b.sentAt > limit {
			st.failed(p, b, now, reasonNoAnswer)
		}
	}
	st.flush(p, now)
}

// drop counts as lost the charges not yet acknowledged when the plugin
// instance goes away (its configuration was replaced).
func (st *settler) drop(p *Plugin) {
	if n := len(st.pending) + st.inBatches; n > 0 {
		p.host.IncrementCounter(st.lostID, int64(n))
	}
	*st = settler{}
}

// nextDue returns when the settler next has something to do, if anything:
// a batch to form, one to send again, a call overdue.
func (st *settler) nextDue() (due int64, ok bool) {
	if n := len(st.pending); n > 0 && st.inBatches+min(n, st.cfg.BatchMax) <= st.cfg.QueueMax {
		due, ok = st.since+int64(st.cfg.IntervalMs)*config.Millisecond, true
	}
	for _, b := range st.batches {
		t := b.retryAt
		if b.inFlight {
			t = b.sentAt + int64(st.cfg.TimeoutMs)*config.Millisecond + overdueGrace + 1
		}
		if !ok || t < due {
			due, ok = t, true
		}
	}
	return due, ok
}
