package core

import (
	"github.com/sluicehq/sluice/filter/core/calls"
	"github.com/sluicehq/sluice/filter/core/config"
)

// Tick does what is due: it gives up on the calls the proxy never
// answered, sends the settlements and lease renewals due, wakes the
// requests whose wait is over, resumes the held requests whose release
// time has come, and reads the per-Envoy state's seeds. A host calls it
// when Schedule asked, or about once a second.
func (w *Worker) Tick() {
	defer w.recoverHook("tick")
	if w.cfg == nil {
		return
	}
	now := w.host.Now()
	w.overdue = w.calls.Overdue(w.overdue[:0], now)
	for i, h := range w.overdue {
		func() {
			defer w.recoverAnswer() // as Answer does
			h.Answered(&calls.NeverAnswered)
		}()
		w.overdue[i] = nil
	}
	w.usage.flush(now)
	w.leases.renew.r.Tick(now)
	w.leases.wakeStale(now)
	w.shaping.releaseDue(now)
	w.tokens.expire(now)
	if w.checks.blocks != nil {
		w.checks.blocks.Refresh()
	}
	w.leases.tick()
	w.schedule(now)
}

// schedule asks the host for the next tick: at the earliest release while
// requests are held, at the settlements' or renewals' next due time if
// sooner, every waitTick while requests wait for another worker's call,
// and else in tickPeriod.
func (w *Worker) schedule(now int64) {
	at := now + tickPeriod
	if held := w.shaping.held; len(held) > 0 {
		at = min(at, held[0].releaseAt)
	}
	if due, ok := w.usage.nextDue(); ok {
		at = min(at, due)
	}
	if due, ok := w.tokens.nextBodyDue(); ok {
		at = min(at, due)
	}
	if due, ok := w.leases.renew.r.NextDue(w.cfg.Timeout + overdueGrace); ok {
		at = min(at, due)
	}
	if w.leases.waitsRemote() {
		at = now + waitTick // requests wait for another worker's call (wait.go)
	}
	w.tickAt = max(at, now+config.Millisecond)
	w.host.Schedule(w.tickAt - now)
}
