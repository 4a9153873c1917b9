package core

import (
	"strconv"

	"github.com/sluicehq/sluice/filter/core/calls"
	"github.com/sluicehq/sluice/filter/core/config"
	"github.com/sluicehq/sluice/filter/core/descriptors"
	"github.com/sluicehq/sluice/filter/core/rlsproto"
	"github.com/sluicehq/sluice/filter/core/settle"
)

// tickPeriod is how often a worker ticks with nothing due: it gives up on
// calls the proxy never answered and reads the per-Envoy state's seeds.
const tickPeriod = config.Second

// overdueGrace is how long past its timeout a call may stay unanswered
// before the tick gives up on it (the proxy should answer at the timeout).
const overdueGrace = config.Second

// Worker is the filter of one configuration on one worker thread: it
// decides the requests of its streams, keeps its calls, its held and
// waiting requests, and its share of the per-Envoy state. It is not safe
// for concurrent use; a host calls it from one thread at a time.
//
// Every hook recovers from a panic in the core, but RequestHeaders, whose
// host recovers (a second deferred recover would cost the hottest hook as
// much again as its frame) and hands the value to Recover: a panic while a
// stream is being decided applies the failure mode to it; one elsewhere is
// logged.
type Worker struct {
	env
	// The stages of the request path first: what every request reads.
	descs   descriptors.Set // scratch: the request's descriptors
	checks  checker         // the precheck stage (precheck.go)
	leases  leaser          // lease pools, waiting, renewals (leases.go, wait.go, renew.go)
	replies replies         // the local replies' and rate limit headers (reply.go)
	out     outbox          // the calls (call.go)
	calls   calls.Table
	shaping shaper  // requests held (shaping, hold.go)
	usage   settler // the settlement queue of usage-based limits (settling.go)
	tokens  tokens  // LLM traffic: reserves from request bodies, usage from answers, cuts (tokens.go)
	// Scratch space reused by every answer and tick.
	resp      rlsproto.Response
	overdue   []calls.Handler
	exchanges exchanges
	// current is the exchange whose answer is being applied, for recovery.
	current *Exchange
	// tickAt is when the worker last asked to tick (Host.Schedule).
	tickAt int64
}

// NewWorker returns a worker that talks to the proxy through host. It
// lets every request through until Configure accepts a configuration.
func NewWorker(host Host) *Worker {
	w := &Worker{env: env{host: host, lastWarn: -logEvery}}
	w.usage.tokens = settle.NewTokens()
	return w
}

// Configure reads and applies the plugin configuration; false refuses it
// (logged), and the worker keeps the one it had.
func (w *Worker) Configure(data []byte) (ok bool) {
	defer w.recoverHook("configuring")
	cfg, err := config.Parse(data)
	if err != nil {
		w.host.Log(LevelError, "sluice: invalid plugin configuration: "+err.Error())
		return false
	}
	w.cfg = cfg
	w.define(mAllowed, mHeld)
	w.checks = newChecker(&w.env)
	w.shaping = shaper{env: &w.env, held: w.shaping.held}
	// With shared_state off, the blocks stay in the worker's table and the
	// leases make a pool of the worker's own.
	pools := w.host.Pools(cfg.Domain, !cfg.SharedState)
	w.leases = newLeaser(w, pools)
	w.out = newOutbox(&w.env, &w.calls, pools.Caller())
	w.replies = newReplies(&w.env)
	w.usage.configure(w, cfg)
	w.tokens.configure(w, cfg)
	w.tickAt = 0
	now := w.host.Now()
	w.schedule(now)
	w.host.Log(LevelInfo, "sluice: configured for domain "+cfg.Domain+" with "+
		strconv.Itoa(len(cfg.RateLimits))+" rate limits, control plane cluster "+cfg.Cluster)
	return true
}

// Open returns the exchange of a new stream s, which the host passes to
// the stream's hooks until it calls Close.
func (w *Worker) Open(s Stream) *Exchange {
	x := w.exchanges.get()
	x.reset(w, s)
	return x
}

// Recover handles a panic r recovered from RequestHeaders as the failure
// mode of x, and returns the hook's action.
func (w *Worker) Recover(x *Exchange, r any) Action {
	w.current = x
	return w.handlePanic(r, "request headers", false)
}

// RequestBody is told of the request body received so far (size bytes;
// end: all of it). A request whose reserve is sized from its body is
// decided once it is read (tokens.go): RequestHeaders runs then, and its
// action is this hook's. A request not decided yet waits, its body with
// it (Pause: the host buffers the body); a decided one goes on.
func (w *Worker) RequestBody(x *Exchange, size int, end bool) (action Action) {
	switch x.state {
	case stateBody:
	case statePending, stateAnswering, stateHeld, stateWaiting:
		return Pause
	default:
		return Continue
	}
	defer func() {
		if r := recover(); r != nil {
			action = w.Recover(x, r)
		}
	}()
	if !w.tokens.readBody(x, size, end) {
		return Pause
	}
	x.state = stateIdle
	return w.RequestHeaders(x)
}

// ResponseHeaders adds the rate limit headers to an admitted request's
// response, and reads the usage-based limits' response-header values.
func (w *Worker) ResponseHeaders(x *Exchange, end bool) {
	if len(x.response.spans) != 0 || x.usage.armed {
		w.responseHeaders(x, end)
	} // else nothing to add (a local reply, most often): no call, no deferred recover
}

// responseHeaders is ResponseHeaders when there is something to do (apart,
// so that the common case inlines into the host's callback).
func (w *Worker) responseHeaders(x *Exchange, end bool) {
	defer w.recoverHook("response headers")
	if x.usage.armed {
		w.usage.captureHeaders(x, end)
		w.tokens.beginAnswer(x)
	}
	for _, h := range x.response.list() {
		if err := x.stream.AddResponseHeader(h[0], h[1]); err != nil {
			w.warn("sluice: cannot add response header " + h[0] + ": " + err.Error())
		}
	}
	x.response.reset()
}

// ResponseBody counts a chunk of the response body (size bytes; end: the
// last) of a stream with usage-based limits, and reads it when a rate
// limit reads the answer's usage (which may change the chunk: tokens.go).
func (w *Worker) ResponseBody(x *Exchange, size int, end bool) {
	if x.usage.armed {
		if x.usage.llm {
			w.tokens.chunk(x, size)
		}
		w.usage.captureBody(x, size, end)
	}
}

// ResponseTrailers reads the usage-based limits' response-trailer values.
func (w *Worker) ResponseTrailers(x *Exchange) {
	if !x.usage.armed {
		return
	}
	defer w.recoverHook("response trailers")
	w.usage.captureTrailers(x)
}

// End is told that the stream ended (Envoy's access log hook, or its
// stream completion): a request still held or waiting is dropped (its
// client went away), and the usage-based limits settle. A host calls it
// once or more, before Close; only the first counts.
func (w *Worker) End(x *Exchange) {
	if x.state == stateHeld || x.state == stateWaiting || x.usage.armed || x.meter != nil {
		w.end(x)
	} // else the common case: no call, no deferred recover
}

// end is End when there is something to do (apart, so that the common case
// inlines into the host's callback): a request held or waiting is dropped,
// and the usage-based limits settle.
func (w *Worker) end(x *Exchange) {
	defer w.recoverHook("ending a stream")
	switch x.state {
	case stateHeld:
		w.shaping.unhold(x)
	case stateWaiting:
		w.leases.unwait(x)
	}
	w.usage.settleStream(x)
	w.tokens.release(x)
}

// Close is told that the host forgets the stream: the core never calls it
// again. An exchange whose call is still out is kept until the answer
// (which still teaches the precheck) or the call's deadline.
func (w *Worker) Close(x *Exchange) {
	if x.state == stateHeld || x.state == stateWaiting || x.usage.armed || x.meter != nil {
		w.end(x) // a host that ends streams with a Close alone
	}
	x.closed = true
	w.exchanges.release(x)
}

// exchanges keeps closed exchanges for reuse: their buffers have grown.
type exchanges struct {
	free []*Exchange
}

// get returns an exchange to reset.
func (p *exchanges) get() *Exchange {
	if n := len(p.free); n > 0 {
		x := p.free[n-1]
		p.free = p.free[:n-1]
		return x
	}
	return &Exchange{}
}

// release keeps x for reuse if its stream is closed and no call of it is
// under way (a decision, or draws).
func (p *exchanges) release(x *Exchange) {
	if !x.closed || x.state == statePending || x.draws > 0 {
		return
	}
	x.w = nil
	p.free = append(p.free, x)
}

// Answer takes the answer to call id: the host turned its proxy's
// response (or the call's failure) into a. An answer to a call the worker
// gave up on, or not its own, is ignored.
func (w *Worker) Answer(id uint32, a *rlsproto.Answer) {
	h, ok := w.calls.Take(id)
	if !ok {
		return
	}
	defer w.recoverAnswer()
	h.Answered(a)
}

// Cancel is told that the proxy dropped call id with no answer to come,
// because the stream that made it ended (a native host's stream callout
// dies with its stream): the request is left undecided, counted nowhere,
// and the requests that waited for the call wake and take their pool or
// call themselves. A call no stream waits on is never cancelled; for one,
// Cancel is Answer with calls.NeverAnswered.
func (w *Worker) Cancel(id uint32) {
	h, ok := w.calls.Take(id)
	if !ok {
		return
	}
	defer w.recoverAnswer()
	x, ok := h.(*Exchange)
	if !ok {
		h.Answered(&calls.NeverAnswered)
		return
	}
	x.state = stateDone
	w.leases.called(x)
	w.exchanges.release(x)
}

// Stop is told that the configuration goes away: the calls under way are
// forgotten and the unsettled usage charges counted as lost.
func (w *Worker) Stop() {
	defer w.recoverHook("stopping")
	w.calls.Clear()
	w.usage.drop()
	w.cfg = nil
}

// recoverAnswer, deferred, turns a panic while an answer is applied into
// the failure mode of the stream it decides, if any.
func (w *Worker) recoverAnswer() {
	if r := recover(); r != nil {
		w.handlePanic(r, "a call's answer", true)
	}
	w.current = nil
}

// handlePanic is the recovery of a panic r while w.current was being
// decided: its failure mode applies, if the stream is still undecided.
// paused says whether the request waits for the hook (an answer) rather
// than for its return value.
func (w *Worker) handlePanic(r any, hook string, paused bool) Action {
	x := w.current
	w.current = nil
	w.host.Log(LevelCritical, "sluice: panic in "+hook+": "+panicText(r))
	if x == nil || x.w == nil {
		return Continue
	}
	if x.state == statePending && !paused {
		w.calls.Remove(x.callID) // its answer will be ignored
	}
	action := w.failSafely(x, "panic in "+hook, paused)
	x.state = stateDone
	w.exchanges.release(x)
	return action
}

func panicText(r any) string {
	switch v := r.(type) {
	case error:
		return v.Error()
	case string:
		return v
	}
	return "(non-error value)"
}
