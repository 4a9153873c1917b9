package core

import (
	"strconv"
	"unsafe"

	"github.com/sluicehq/sluice/filter/core/config"
	"github.com/sluicehq/sluice/filter/core/headermap"
	"github.com/sluicehq/sluice/filter/core/precheck"
	"github.com/sluicehq/sluice/filter/core/rlsproto"
	"github.com/sluicehq/sluice/filter/core/settle"
)

// settler is a worker's side of usage-based limits: it reads what the
// responses cost (usage.go) and settles the charges through a settlement
// queue (package settle), sending its batches and applying their answers.
//
// The tick: while charges wait or batches are unacknowledged, the tick is
// asked for at the next thing due (a batch forming, a retry, a call
// overdue); with none, it goes back to its idle period, so an idle filter
// ticks no more than without usage-based limits.
//
// The answers teach the precheck: a descriptor answered OVER_LIMIT with a
// duration_until_reset means that a request of cost 1 would be refused
// until then, which is exactly what a request-time check of cost 1 (or a
// probe, cost 0) asks: the key is blocked in the precheck table, and
// shared with the other workers, as for an over-limit answer at request
// time, with the same margins (the block ends the call timeout before the
// reset counted from when the settle call was sent).
type settler struct {
	*env
	w      *Worker
	q      *settle.Queue // nil when no rate limit is usage-based
	tokens *settle.Tokens
	// headers are a settle call's, less the token (the last one's value).
	headers [][2]string
	timeout int64 // a settle call's, ns
	// Scratch.
	due  []*settle.Batch
	call Call
	hmap []byte
	body []byte
}

// settlement is the handler of a settle call.
type settlement struct {
	st *settler
	b  *settle.Batch
}

// Answered takes the answer to the settle call: it implements
// calls.Handler.
func (c *settlement) Answered(a *rlsproto.Answer) { c.st.answered(c.b, a) }

// configure sets the settler up for cfg (a queue only when a rate limit is
// usage-based).
func (st *settler) configure(w *Worker, cfg *config.Config) {
	*st = settler{env: &w.env, w: w, tokens: st.tokens}
	if !cfg.HasUsage() {
		return
	}
	st.q = settle.New(cfg.Settle, st.tokens)
	st.timeout = int64(cfg.Settle.TimeoutMs) * config.Millisecond
	st.headers = rlsproto.CallHeaders(cfg.Authority, st.timeout, [2]string{rlsproto.SettleHeader, ""})
	st.define(mUsageSettled, mUsageRefundsLapsed)
}

// charge queues a charge (amount > 0) or a refund (< 0) for the
// descriptor key at now.
func (st *settler) charge(key []byte, amount int64, now int64) {
	if err := st.q.Add(key, amount, now); err != nil {
		st.count(mUsageSettleLost)
		if err == settle.ErrFull {
			st.warn("sluice: a usage charge was lost: " + strconv.Itoa(st.cfg.Settle.QueueMax) + " charges wait to be settled (settle.queue_max)")
		} else {
			st.warn("sluice: a usage charge was lost: " + err.Error())
		}
	}
}

// flush forms the batches that are due and sends those that may be sent.
func (st *settler) flush(now int64) {
	if st.q == nil {
		return
	}
	st.due = st.q.Due(st.due[:0], now)
	for i, b := range st.due {
		st.send(b, now)
		st.due[i] = nil
	}
}

// send sends batch b.
func (st *settler) send(b *settle.Batch, now int64) {
	st.body = st.q.Frame(st.body[:0], st.cfg.Domain, b)
	st.headers[len(st.headers)-1][1] = b.Token
	st.hmap = headermap.Append(st.hmap[:0], st.headers)
	if b.Attempts > 0 {
		st.count(mUsageSettleRetries)
	}
	st.call = Call{Cluster: st.cfg.Cluster, Headers: st.hmap, Frame: st.body, TimeoutMs: uint32(st.cfg.Settle.TimeoutMs)}
	id, err := st.host.Call(nil, &st.call)
	st.call = Call{}
	if err != nil {
		st.failed(b, now, "cannot call the control plane (cluster "+st.cfg.Cluster+"): "+err.Error())
		return
	}
	st.q.Sent(b, now)
	st.w.calls.Add(id, &settlement{st: st, b: b}, now+st.timeout+overdueGrace)
}

// failed schedules batch b to be sent again, with the same token.
func (st *settler) failed(b *settle.Batch, now int64, reason string) {
	st.q.Failed(b, now)
	st.warn("sluice: a settlement call failed, retrying with the same token " + b.Token + ": " + reason)
}

// answered takes the answer a to b's settle call.
func (st *settler) answered(b *settle.Batch, a *rlsproto.Answer) {
	now := st.host.Now()
	reason := a.Failure
	resp := &st.w.resp
	if reason == "" {
		if err := rlsproto.Decode(a.Message, resp); err != nil {
			reason = err.Error()
		}
	}
	switch {
	case reason != "" && a.Refused:
		// The control plane refuses the batch as malformed: sending it
		// again cannot help.
		st.q.Remove(b)
		st.add(mUsageSettleLost, int64(len(b.Keys)))
		st.warn("sluice: the control plane refused a settlement, its charges are lost: " + reason)
		st.flush(now)
	case reason != "":
		st.failed(b, now, reason)
	default:
		st.q.Remove(b)
		st.add(mUsageSettled, int64(len(b.Keys)))
		st.count(mUsageSettleCalls)
		st.learn(b, resp, now)
		st.flush(now) // room for waiting charges
	}
	st.w.schedule(now)
}

// learn blocks in the precheck the descriptors of acknowledged batch b
// that the answer resp says are over their limit, and unblocks those whose
// refund left something (the refund freed them).
func (st *settler) learn(b *settle.Batch, resp *rlsproto.Response, now int64) {
	if !st.w.checks.on {
		return
	}
	for i := range resp.Statuses {
		if i >= len(b.Keys) {
			break
		}
		key := unsafe.Slice(unsafe.StringData(b.Keys[i]), len(b.Keys[i])) // read only
		switch s := &resp.Statuses[i]; {
		case s.Code == rlsproto.CodeOverLimit:
			st.w.checks.learnBlock(key, overLimitOutcome(resp, i, b.SentAt), now)
		case b.Amounts[i] < 0 && s.Code == rlsproto.CodeOK && s.LimitRemaining > 0:
			st.w.checks.unblock(key, now)
		}
	}
}

// overLimitOutcome is what status i of resp, OVER_LIMIT, of a call sent at
// sentAt teaches the precheck: a request of cost 1 is refused until its
// reset.
func overLimitOutcome(resp *rlsproto.Response, i int, sentAt int64) precheck.Outcome {
	retry := descriptorRetryAfter(resp, i)
	if resp.Statuses[i].HasReset {
		retry = max(resp.Statuses[i].DurationUntilReset, 0)
	}
	lim, hasLimit := descriptorLimit(resp, i)
	return precheck.Outcome{Cost: 1, Limit: lim, HasLimit: hasLimit, OverLimit: true, RetryAfter: retry,
		SentAt: sentAt, Name: limitName(resp, i)}
}

// drop counts as lost the charges not yet acknowledged when the
// configuration goes away.
func (st *settler) drop() {
	if st.q == nil {
		return
	}
	if n := st.q.Unsettled(); n > 0 {
		st.add(mUsageSettleLost, int64(n))
	}
	st.q = nil
}

// nextDue returns when the settler next has something to do, if anything.
func (st *settler) nextDue() (int64, bool) {
	if st.q == nil {
		return 0, false
	}
	return st.q.NextDue(st.timeout + overdueGrace)
}
