package core

import (
	"strconv"

	"github.com/sluicehq/sluice/filter/core/config"
	"github.com/sluicehq/sluice/filter/core/rlsproto"
)

// Shaping: a request the control plane answers OK with a wait (algorithm
// reserve, wait_ms in the sluice metadata) is held, still paused after the
// call, and resumed when its wait is over.
//
// A worker keeps its held requests in a list ordered by release time (ties
// in the order they were held) and resumes them on its tick, which it asks
// for at the earliest release (Host.Schedule), so a request is resumed at
// its release time rounded up to a millisecond plus the worker's
// event-loop latency, never before it; with nothing held the tick goes
// back to its idle period, so shaping costs an idle Envoy nothing. The
// wait counts from the answer's arrival: the control plane's slot began
// when it decided, so a request is resumed late by the answer's trip
// back, never early.
//
// At most config.MaxHeld requests are held at once; one beyond it is
// answered 429 (sluice.hold_rejected). A held request whose client goes
// away is dropped from the list when the stream ends (Worker.End or
// Worker.Close, whichever comes first). The request sent upstream carries
// HeaderDelayed, the milliseconds it was held; sluice.held is the gauge of
// requests held now, sluice.delayed the count of requests held,
// sluice.delayed_ms the sum of their holds.

// HeaderDelayed is the request header that tells the upstream how long the
// filter held the request, in whole milliseconds; with headers.delayed in
// the plugin configuration the client's response carries it too.
const HeaderDelayed = "x-sluice-delayed-ms"

// maxWait bounds the wait the filter accepts from an answer (the policy's
// bound on max_wait), so that a corrupt answer cannot hold a request for
// ever.
const maxWait = 3600 * config.Second

// answerWait returns the longest wait (ns) of the descriptors of an OK
// answer resp.
func answerWait(resp *rlsproto.Response) int64 {
	var wait float64
	for i := range resp.Limits {
		wait = max(wait, resp.Limits[i].WaitMs)
	}
	if wait <= 0 {
		return 0
	}
	ns := wait * float64(config.Millisecond)
	if ns >= float64(maxWait) {
		return maxWait
	}
	return int64(ns + 0.999999) // whole nanoseconds, rounded up
}

// shaper holds a worker's requests the control plane admitted with a wait.
type shaper struct {
	*env
	held []*Exchange // by release time
}

// hold holds x's request for wait ns from now, or answers 429 (headers
// from r) when the worker holds max_held requests already. It reports
// whether x is now the first to be released: the tick is due sooner.
func (w *shaper) hold(x *Exchange, r *replies, now, wait int64) (first bool) {
	if len(w.held) >= w.cfg.MaxHeld {
		x.state = stateDone
		x.usage.armed = false // refused: it does not run
		w.count(mHoldRejected)
		if err := x.stream.SendLocalReply(429, DetailsHoldFull, bodyOverLimit, r.holdFull()); err != nil {
			w.warn("sluice: cannot send the local reply: " + err.Error())
			w.resume(x)
		}
		return false
	}
	x.state, x.heldAt, x.releaseAt = stateHeld, now, now+wait
	// Insert after every stream due at the same time or earlier: release
	// order is release time, then arrival.
	i := len(w.held)
	for i > 0 && w.held[i-1].releaseAt > x.releaseAt {
		i--
	}
	w.held = append(w.held, nil)
	copy(w.held[i+1:], w.held[i:])
	w.held[i] = x
	w.add(mHeld, 1)
	return i == 0
}

// releaseDue resumes the held requests whose release time has come, in
// order.
func (w *shaper) releaseDue(now int64) {
	n := 0
	for n < len(w.held) && w.held[n].releaseAt <= now {
		x := w.held[n]
		n++
		x.state = stateDone
		w.add(mHeld, -1)
		ms := (now - x.heldAt) / config.Millisecond
		if err := x.stream.AddRequestHeader(HeaderDelayed, strconv.FormatInt(ms, 10)); err != nil {
			w.count(mHoldAbandon) // gone without the host's Close
			continue
		}
		w.count(mDelayed)
		if ms > 0 {
			w.add(mDelayedMs, ms)
		}
		if w.cfg.Headers.Delayed {
			x.response.add(HeaderDelayed, strconv.FormatInt(ms, 10))
		}
		w.resume(x)
	}
	if n > 0 {
		clear(w.held[:n])
		w.held = append(w.held[:0], w.held[n:]...)
	}
}

// unhold drops a held request whose stream ended.
func (w *shaper) unhold(x *Exchange) {
	for i, h := range w.held {
		if h == x {
			w.held = removeAt(w.held, i)
			w.add(mHeld, -1)
			w.count(mHoldAbandon)
			break
		}
	}
	x.state = stateDone
	x.usage.armed = false // it never ran
}
