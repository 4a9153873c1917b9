package core

import (
	"math"

	"github.com/sluicehq/sluice/filter/core/config"
	"github.com/sluicehq/sluice/filter/core/descriptors"
	"github.com/sluicehq/sluice/filter/core/llm"
	"github.com/sluicehq/sluice/filter/core/meter"
)

// LLM traffic: the rate limits whose usage is an LLM API's tokens.
//
// A rate limit with reserve_from_request reserves what its request may
// cost: the request waits, headers paused, until its body is read (at most
// llm.max_request_bytes of it; a longer body, or one that is not JSON,
// gets the rate limit's reserve, counted), and the reserve is the prompt's
// estimate plus the maximum output (package llm), in tokens or weighted.
// Then the request is decided as any other (RequestHeaders runs again,
// with the reserves).
//
// A rate limit whose source is llm_usage reads the answer's own usage
// object as the answer goes by (a JSON body, or an SSE stream by its
// content type), and at stream end its cost (tokens, or weighted with the
// request's model) is settled against what was reserved: the difference
// is charged, or refunded.
//
// A rate limit with cut counts the output tokens of an SSE answer as its
// events pass, draws them from the stream's reserve and then from slices
// it asks the control plane for (draw.go), and when the key has nothing
// left and the stream has run a slice past what it was granted, ends the
// answer with the provider's error event (package meter shapes the
// chunks).
//
// A stream's meter (its readers, a held event) comes from a pool and goes
// back at stream end: nothing of a stream is left once it is done.

// tokens is a worker's stage for LLM traffic.
type tokens struct {
	*env
	w           *Worker
	readsBody   bool // a rate limit sizes its reserve from the request body
	readsAnswer bool // a rate limit reads the answer's usage
	cuts        bool // a rate limit may cut a stream
	opts        llm.StreamOptions
	pool        meter.Pool
	// bodies are the exchanges whose request body is awaited, oldest
	// first; each is decided at its bodyDue at the latest. sawBody says
	// that a body ever reached this worker (else a body that never came
	// is a host that does not pass bodies to a waiting filter).
	bodies  []*Exchange
	sawBody bool
	// Scratch.
	out     []byte       // a chunk that changes
	budget  streamBudget // the budget of the chunk being read
	frame   []byte       // a draw's call
	descs   []descriptors.Descriptor
	entries []descriptors.Entry
}

// configure sets the stage up for cfg.
func (t *tokens) configure(w *Worker, cfg *config.Config) {
	*t = tokens{env: &w.env, w: w, pool: t.pool, out: t.out, frame: t.frame, bodies: t.bodies, sawBody: t.sawBody}
	t.budget.t = t
	for i := range cfg.RateLimits {
		if u := cfg.RateLimits[i].Usage; u != nil {
			t.readsBody = t.readsBody || u.FromRequest
			t.readsAnswer = t.readsAnswer || u.Source == config.SourceLLMUsage
			t.cuts = t.cuts || u.Cut != nil
		}
	}
	t.opts = llm.StreamOptions{Ratio: cfg.LLM.Ratio, MaxEventBytes: cfg.LLM.MaxEventBytes}
	if t.readsBody || t.readsAnswer {
		t.define(mLLMRequestTooLarge, mLLMEventsOverlong)
	}
}

// meterOf returns x's meter, taking one from the pool if it has none.
func (t *tokens) meterOf(x *Exchange) *meter.Stream {
	if x.meter == nil {
		x.meter = t.pool.Get()
		if t.cuts {
			if p, ok := x.stream.RequestHeader(":path"); ok {
				x.meter.Format, _ = llm.FormatOf(p)
			}
		}
	}
	return x.meter
}

// release gives x's meter back to the pool.
func (t *tokens) release(x *Exchange) {
	if x.state == stateBody {
		t.bodyRead(x)
	}
	if m := x.meter; m != nil {
		x.meter = nil
		t.pool.Put(m)
	}
}

// bodyWait bounds how long a request waits for its body: past it, it is
// decided with what came (the reserve of a body that cannot be read).
const bodyWait = 5 * config.Second

// awaitBody starts reading x's request body for its reserves, and reports
// whether the request is to wait for it; a request without a body is
// sized at once, with each rate limit's reserve.
func (t *tokens) awaitBody(x *Exchange) bool {
	if x.stream.RequestEnded() {
		t.size(x, nil)
		return false
	}
	t.meterOf(x).BeginRequest(t.cfg.LLM.MaxRequestBytes)
	x.state = stateBody
	now := t.host.Now()
	x.bodyDue = now + bodyWait
	t.bodies = append(t.bodies, x)
	if len(t.bodies) == 1 && x.bodyDue < t.w.tickAt {
		t.w.schedule(now)
	}
	return true
}

// bodyRead forgets x, whose body was read (or whose stream ended).
func (t *tokens) bodyRead(x *Exchange) {
	for i, y := range t.bodies {
		if y == x {
			t.bodies = removeAt(t.bodies, i)
			return
		}
	}
}

// nextBodyDue returns when the oldest awaited body is due, if any.
func (t *tokens) nextBodyDue() (int64, bool) {
	if len(t.bodies) == 0 {
		return 0, false
	}
	return t.bodies[0].bodyDue, true
}

// expire decides, at now, the requests whose body did not come in time,
// with what came of it; a worker that never saw a body says why.
func (t *tokens) expire(now int64) {
	for len(t.bodies) > 0 && t.bodies[0].bodyDue <= now {
		x := t.bodies[0]
		t.bodies = removeAt(t.bodies, 0)
		if x.state != stateBody || x.closed {
			continue
		}
		if !t.sawBody {
			t.warn("sluice: a request body never reached the filter within 5s, so its reserve is the rate limit's reserve: " +
				"with filter.wasm, set allow_on_headers_stop_iteration: true in the Wasm filter's configuration")
		}
		t.decideLate(x)
	}
}

// decideLate decides x, whose body is given up on, outside its hooks: as
// RequestHeaders would, resuming it if it goes on.
func (t *tokens) decideLate(x *Exchange) {
	w := t.w
	x.meter.EndRequest()
	t.size(x, nil)
	x.state = stateIdle
	action := Continue
	func() {
		defer func() {
			if r := recover(); r != nil {
				action = w.Recover(x, r)
			}
		}()
		action = w.RequestHeaders(x)
	}()
	if action == Continue {
		t.warnErr("cannot resume the request", x.stream.Resume())
	}
}

// readBody reads what came of x's request body (size bytes so far; end:
// all of it) and reports whether the reserves are sized: the body ended,
// or passed its bound.
func (t *tokens) readBody(x *Exchange, size int, end bool) bool {
	t.sawBody = true
	m := x.meter
	for read := int(m.RequestRead()); read < size && !m.RequestOver(); read = int(m.RequestRead()) {
		p, err := x.stream.RequestBody(read, min(meter.SliceBytes, size-read))
		if err != nil || len(p) == 0 {
			t.warnErr("cannot read the request body", err)
			end = true // what could not be read makes the body malformed
			break
		}
		m.WriteRequest(p)
	}
	if !end && !m.RequestOver() {
		return false
	}
	t.bodyRead(x)
	q := m.EndRequest()
	switch q.Status {
	case llm.RequestTooLarge:
		t.count(mLLMRequestTooLarge)
	case llm.RequestMalformed:
		t.count(mLLMRequestMalformed)
	}
	t.size(x, &q)
	return true
}

// size sets x's reserves: per rate limit sized from the request body, the
// estimate of what q may cost, or its reserve when q could not be read
// (nil: no body).
func (t *tokens) size(x *Exchange, q *llm.Request) {
	rls := t.cfg.RateLimits
	if cap(x.reserves) < len(rls) {
		x.reserves = make([]uint32, len(rls))
	}
	x.reserves = x.reserves[:len(rls)]
	for i := range rls {
		u := rls[i].Usage
		if u == nil || !u.FromRequest {
			continue
		}
		r := int64(u.Reserve)
		if q != nil && q.Status == llm.RequestOK {
			r = t.cost(u, q.Model, q.Usage(t.cfg.LLM.Ratio, t.cfg.LLM.DefaultMaxOutput))
		}
		x.reserves[i] = uint32(min(r, math.MaxUint32))
	}
	x.sized = true
}

// cost is what usage u of model costs a rate limit of usage cu.
func (t *tokens) cost(cu *config.Usage, model string, u llm.Usage) int64 {
	if cu.Cost == config.CostWeighted {
		return t.cfg.LLM.Weights.Cost(model, u)
	}
	return u.Total()
}

// beginAnswer starts reading the answer of x, armed, if a rate limit of it
// reads the answer's usage: by its content type.
func (t *tokens) beginAnswer(x *Exchange) {
	if !x.usage.llm {
		return
	}
	ct, _ := x.stream.ResponseHeader("content-type")
	t.meterOf(x).BeginAnswer(meter.AnswerOf(ct), t.opts)
}

// chunk reads a chunk of x's answer (size bytes) and, for a stream that
// may be cut, shapes it (package meter): held back, or cut.
func (t *tokens) chunk(x *Exchange, size int) {
	defer t.recoverHook("response body")
	m := x.meter
	if m == nil || m.Answer() == meter.AnswerNone {
		return
	}
	var b meter.Budget
	if x.usage.cut {
		t.budget.x = x
		b = &t.budget
	}
	out, shape, err := m.Chunk(x.stream, size, b, int(t.cfg.LLM.HoldBytes), t.out[:0])
	t.out, t.budget.x = out[:0], nil
	if err != nil {
		t.warnErr("cannot read the response body", err)
		return
	}
	if shape.Changed {
		t.warnErr("cannot change the response body", x.stream.SetResponseBody(out))
	}
	if shape.Cut {
		t.count(mLLMCuts)
		x.usage.ended = true // the answer ends here, with the cut event
		x.stream.EndResponse()
	}
}

// actual returns the cost of x's answer for a rate limit of usage cu, from
// its usage object: false when there is none to go by (the caller applies
// cu's missing outcome). A stream that was cut and never got its usage
// costs what was counted: its prompt's estimate (or the input the answer
// gave) and the output tokens counted as its events passed.
func (t *tokens) actual(x *Exchange, cu *config.Usage) (int64, bool) {
	m := x.meter
	if m == nil {
		return 0, false
	}
	res := m.Result()
	u := res.Usage
	switch {
	case res.Status == llm.UsageComplete:
	case m.Cut():
		u.Output = max(u.Output, m.OutputTokens())
		if res.Status != llm.UsagePartial || u.Input+u.Cached+u.CacheWrite == 0 {
			u.Input = m.Request.PromptTokens(t.cfg.LLM.Ratio)
		}
	default:
		return 0, false
	}
	return t.cost(cu, m.Request.Model, u), true
}

// account counts what x's answer met (malformed, oversized and overlong
// events), once, at stream end.
func (t *tokens) account(x *Exchange) {
	m := x.meter
	if m == nil || m.Answer() == meter.AnswerNone {
		return
	}
	st := m.Result().Stats
	if st.Malformed > 0 {
		t.add(mLLMAnswerMalformed, st.Malformed)
	}
	if st.Oversized > 0 {
		t.add(mLLMEventsOversized, st.Oversized)
	}
	if m.Overlong > 0 {
		t.add(mLLMEventsOverlong, int64(m.Overlong))
	}
}

// streamBudget is the budget of the chunk being read (meter.Budget): the
// cut limits of one exchange.
type streamBudget struct {
	t *tokens
	x *Exchange
}

// Allow implements meter.Budget: an event whose output count makes a cut
// limit's cost pass what the stream was granted plus one slice is refused;
// one that leaves less than a slice of what was granted draws another
// (draw.go).
func (b *streamBudget) Allow(out int64) bool {
	t, x := b.t, b.x
	m := x.meter
	u := llm.Usage{Input: m.Request.PromptTokens(t.cfg.LLM.Ratio), Output: out}
	ok := true
	for i := range x.budgets {
		bg := &x.budgets[i]
		if bg.slice == 0 {
			continue
		}
		c := t.cost(t.cfg.RateLimits[x.rateLimits[i]].Usage, m.Request.Model, u)
		if c > bg.granted+bg.slice {
			ok = false
			continue
		}
		if c+bg.slice > bg.granted && !bg.drawing && !bg.refused {
			t.draw(x, i)
		}
	}
	return ok
}
