package core

import (
	"github.com/sluicehq/sluice/filter/core/config"
	"github.com/sluicehq/sluice/filter/core/descriptors"
	"github.com/sluicehq/sluice/filter/core/rlsproto"
)

// Draws: a stream whose answer may be cut, past its reserve, asks the
// control plane for one slice more at a time (a decision call of cost
// slice on the rate limit's descriptor: admitted only if it fits), before
// it needs it: as soon as less than a slice of what it was granted is
// left. The stream may run one slice past what it was granted, so a draw
// answered within the time the answer takes to produce a slice never
// stalls it; once a draw is refused the stream is cut when it has run that
// slice past. So a cut stream's overshoot is at most one slice.

// budget is what one descriptor of a usage-based request was granted, for
// its settlement (and, for a cut limit, its draws).
type budget struct {
	// granted is what the control plane admitted for the stream: the
	// reserve (0 when the failure mode let the request through), plus the
	// slices it drew.
	granted int64
	// until is when the window the last grant was taken in ends (0:
	// unknown): a refund after it would give back what a later window
	// never took, so it is not sent. windowGranted is what was granted in
	// that window: the most a refund gives back.
	until, windowGranted int64
	// slice is the cut limit's slice (0: the limit does not cut).
	slice            int64
	drawing, refused bool
}

// grant adds n granted by an answer whose status st (nil: none) was
// decided after sentAt: the grant's window is that of its reset.
func (b *budget) grant(n int64, st *rlsproto.Status, sentAt int64) {
	b.granted += n
	until := int64(0)
	if st != nil && st.HasReset && st.DurationUntilReset > 0 {
		until = sentAt + st.DurationUntilReset
	}
	if until > b.until+config.Second || b.until == 0 {
		b.until, b.windowGranted = until, n // a new window: the earlier ones' grants are not refundable
		return
	}
	b.windowGranted += n
}

// drawCall is the handler of a draw.
type drawCall struct {
	t      *tokens
	x      *Exchange
	i      int // the descriptor
	sentAt int64
}

// Answered takes the answer to the draw: it implements calls.Handler.
func (d *drawCall) Answered(a *rlsproto.Answer) { d.t.drawn(d, a) }

// draw asks the control plane for one more slice of descriptor i of x.
func (t *tokens) draw(x *Exchange, i int) {
	bg := &x.budgets[i]
	now := t.host.Now()
	t.descs, t.entries, _ = descriptors.AppendParsed(t.descs[:0], t.entries[:0], bufString(x.key(i)), uint32(min(bg.slice, 1<<32-1)))
	o := &t.w.out
	t.frame = rlsproto.AppendRequestFrame(t.frame[:0], t.cfg.Domain, t.descs, o.caller)
	d := &drawCall{t: t, x: x, i: i, sentAt: now}
	if _, err := o.send(nil, t.frame, d, now); err != nil {
		t.warn("sluice: cannot draw a slice of a stream's budget (cluster " + t.cfg.Cluster + "): " + err.Error())
		bg.refused = t.cfg.FailureMode == config.FailClosed
		return
	}
	bg.drawing = true
	x.draws++
}

// drawn takes the answer to draw d: a slice granted, refused (the stream is
// cut a slice past what it has), or failed (the failure mode decides). A
// slice granted to a stream that already settled is given back.
func (t *tokens) drawn(d *drawCall, a *rlsproto.Answer) {
	x := d.x
	x.draws--
	bg := &x.budgets[d.i]
	bg.drawing = false
	defer t.w.exchanges.release(x)
	resp := &t.w.resp
	reason := a.Failure
	if reason == "" {
		if err := rlsproto.Decode(a.Message, resp); err != nil {
			reason = err.Error()
		}
	}
	granted := false
	switch {
	case reason != "" || (resp.OverallCode != rlsproto.CodeOK && resp.OverallCode != rlsproto.CodeOverLimit):
		t.warn("sluice: a draw of a stream's budget failed, failing " + t.cfg.FailureMode.String() + ": " + reason)
		if granted = t.cfg.FailureMode == config.FailOpen; granted {
			bg.grant(bg.slice, nil, d.sentAt)
		} else {
			bg.refused = true
		}
	case resp.OverallCode == rlsproto.CodeOK:
		granted = true
		t.count(mLLMDraws)
		bg.grant(bg.slice, statusOf(resp, 0), d.sentAt)
	default:
		bg.refused = true
		t.count(mLLMDrawsRefused)
		if len(resp.Statuses) > 0 {
			now := t.host.Now()
			t.w.checks.learnBlock(x.key(d.i), overLimitOutcome(resp, 0, d.sentAt), now)
		}
	}
	if granted && !x.usage.armed && x.usage.settled {
		// The stream settled without this slice: give it back.
		if cu := t.cfg.RateLimits[x.rateLimits[d.i]].Usage; cu.Refund {
			t.w.usage.refund(x, d.i, bg.slice, t.host.Now())
		}
	}
}

// statusOf returns resp's status i, or nil.
func statusOf(resp *rlsproto.Response, i int) *rlsproto.Status {
	if i < len(resp.Statuses) {
		return &resp.Statuses[i]
	}
	return nil
}
