package host

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/tetratelabs/wazero/api"
)

// StreamInfo describes the connection and request a stream belongs to; it
// backs properties such as source.address.
type StreamInfo struct {
	// RemoteAddr is the client's "ip:port" (source.address).
	RemoteAddr string
	// LocalAddr is the "ip:port" the client connected to (destination.address).
	LocalAddr string
	// Protocol is "HTTP/1.1", "HTTP/2", ... (request.protocol; default HTTP/1.1).
	Protocol string
	// Start is when the request arrived (request.time; default Config.Now()).
	Start time.Time
	// ConnectionID identifies the downstream connection (connection.id).
	ConnectionID uint64
}

// DecisionKind says how a stream callback left the stream.
type DecisionKind int

// DecisionKind values.
const (
	// DecisionContinue: proceed (forward the request, send the response).
	DecisionContinue DecisionKind = iota
	// DecisionPause: the filter paused the stream; call Await.
	DecisionPause
	// DecisionLocalResponse: the filter sent a local response (Decision.Local).
	DecisionLocalResponse
	// DecisionReset: the filter closed the stream (proxy_close_stream).
	DecisionReset
	// DecisionFailed: the VM trapped or is shut down (Decision.Err).
	DecisionFailed
	// DecisionTimeout: Await's context ended while the stream was paused.
	DecisionTimeout
)

// String names the kind.
func (k DecisionKind) String() string {
	switch k {
	case DecisionContinue:
		return "continue"
	case DecisionPause:
		return "pause"
	case DecisionLocalResponse:
		return "local-response"
	case DecisionReset:
		return "reset"
	case DecisionFailed:
		return "failed"
	case DecisionTimeout:
		return "timeout"
	}
	return "DecisionKind(" + strconv.Itoa(int(k)) + ")"
}

// Decision is the outcome of a stream callback, or of waiting on a paused
// stream.
type Decision struct {
	// Kind of outcome.
	Kind DecisionKind
	// Local is the response the filter sent, for DecisionLocalResponse.
	Local *LocalResponse
	// Err explains DecisionFailed and DecisionTimeout.
	Err error
}

// LocalResponse is what a filter passed to proxy_send_local_response.
type LocalResponse struct {
	// Status is the HTTP status code.
	Status int
	// Body is the response body.
	Body []byte
	// Headers are the additional headers the filter asked for.
	Headers Headers
	// Details is the response code details string.
	Details string
	// GRPCStatus is the gRPC status the filter passed (-1, i.e. 0xffffffff,
	// when it set none).
	GRPCStatus int32
}

// LocalReplyHeaders builds the response headers Envoy sends for a local
// reply: ":status", the filter's headers, "content-length", and
// "content-type: text/plain" when the body is not empty and the filter set no
// content type.
func LocalReplyHeaders(lr *LocalResponse) Headers {
	h := Headers{{":status", strconv.Itoa(lr.Status)}}
	h = append(h, lr.Headers.Clone()...)
	h.replace("content-length", strconv.Itoa(len(lr.Body)))
	if _, ok := h.Get("content-type"); !ok && len(lr.Body) > 0 {
		h.add("content-type", "text/plain")
	}
	return h
}

// phase is where a stream is in its life.
type phase int

// phase values.
const (
	phaseCreated  phase = iota // context created, no headers yet
	phaseRequest               // request headers/body being filtered
	phaseForward               // request continued, waiting for the upstream
	phaseResponse              // response headers/body being filtered
	phaseDone                  // response sent downstream, or finished
)

// verdict is what the filter decided for a paused (or running) phase.
type verdict int

// verdict values.
const (
	verdictNone verdict = iota
	verdictContinue
	verdictLocal
	verdictReset
)

// Stream is one HTTP request/response pair on a VM: a proxy-wasm stream
// context. Its methods drive the callbacks in order; each holds the VM for
// the duration of the callback. All fields are guarded by vm.mu.
type Stream struct {
	vm   *VM
	id   uint32
	info StreamInfo

	req, resp         Headers // request and response headers
	reqBody, respBody []byte  // bodies handed to body callbacks

	reqWritable   bool // HTTP_REQUEST_HEADERS readable and writable
	respWritable  bool // HTTP_RESPONSE_HEADERS readable and writable
	reqBodyAvail  bool // HTTP_REQUEST_BODY available
	respBodyAvail bool // HTTP_RESPONSE_BODY available
	inLog         bool // inside proxy_on_log: all headers readable
	inCallback    bool // a callback of this stream is running

	phase      phase
	paused     bool           // the current phase is paused
	verdict    verdict        // decided while running or paused
	local      *LocalResponse // set with verdictLocal
	localReply bool           // the response being filtered is a local reply
	resetAsked bool           // proxy_close_stream was called
	last       Decision       // the latest decision
	signal     chan struct{}  // wakes Await

	upstreamAddr string            // upstream.address once forwarded
	props        map[string][]byte // proxy_set_property values
	finished     bool              // Finish ran
}

// ErrVMFailed is wrapped by NewStream's error when the VM trapped earlier.
var ErrVMFailed = errors.New("wasm VM failed")

// NewStream creates a stream context: proxy_on_context_create(id, root).
func (vm *VM) NewStream(info StreamInfo) (*Stream, error) {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	if vm.failed != nil {
		return nil, fmt.Errorf("%w: %v", ErrVMFailed, vm.failed)
	}
	if vm.closed {
		return nil, errVMClosed
	}
	if info.Protocol == "" {
		info.Protocol = "HTTP/1.1"
	}
	if info.Start.IsZero() {
		info.Start = vm.host.cfg.Now()
	}
	for {
		vm.nextID++
		if _, used := vm.streams[vm.nextID]; !used && vm.nextID != vm.rootID && vm.nextID != 0 {
			break
		}
	}
	st := &Stream{vm: vm, id: vm.nextID, info: info, signal: make(chan struct{}, 1)}
	vm.streams[st.id] = st
	if vm.fns.contextCreate != nil {
		if _, err := vm.callContext(st, vm.fns.contextCreate, uint64(st.id), uint64(vm.rootID)); err != nil {
			delete(vm.streams, st.id)
			return nil, fmt.Errorf("%w: %v", ErrVMFailed, err)
		}
	}
	return st, nil
}

// ID returns the context id.
func (st *Stream) ID() uint32 { return st.id }

// VM returns the VM the stream runs on.
func (st *Stream) VM() *VM { return st.vm }

// failedDecision reports a failed or closed VM. vm.mu is held.
func (st *Stream) failedDecision() (Decision, bool) {
	vm := st.vm
	if vm.failed != nil {
		return Decision{Kind: DecisionFailed, Err: vm.failed}, true
	}
	if vm.closed || st.finished {
		return Decision{Kind: DecisionFailed, Err: errVMClosed}, true
	}
	return Decision{}, false
}

// RequestHeaders runs proxy_on_request_headers with h (pseudo-headers
// included) as HTTP_REQUEST_HEADERS. The guest may change them; Request
// returns the result.
func (st *Stream) RequestHeaders(h Headers, endOfStream bool) Decision {
	st.vm.mu.Lock()
	defer st.vm.mu.Unlock()
	st.phase = phaseRequest
	st.req = h.Clone()
	st.reqWritable = true
	return st.run(st.vm.fns.requestHeaders, uint64(len(h)), endOfStream)
}

// RequestBody runs proxy_on_request_body with body as HTTP_REQUEST_BODY (the
// host delivers a body in one piece). RequestBodyBytes returns the result.
func (st *Stream) RequestBody(body []byte, endOfStream bool) Decision {
	st.vm.mu.Lock()
	defer st.vm.mu.Unlock()
	st.phase = phaseRequest
	st.reqBody = append([]byte(nil), body...)
	st.reqBodyAvail = true
	return st.run(st.vm.fns.requestBody, uint64(len(body)), endOfStream)
}

// ResponseHeaders runs proxy_on_response_headers with h (":status" included)
// as HTTP_RESPONSE_HEADERS. Response returns the result.
func (st *Stream) ResponseHeaders(h Headers, endOfStream bool) Decision {
	st.vm.mu.Lock()
	defer st.vm.mu.Unlock()
	st.localReply = st.local != nil
	st.phase = phaseResponse
	st.resp = h.Clone()
	st.respWritable = true
	return st.run(st.vm.fns.responseHeaders, uint64(len(h)), endOfStream)
}

// ResponseBody runs proxy_on_response_body with body as HTTP_RESPONSE_BODY.
// ResponseBodyBytes returns the result.
func (st *Stream) ResponseBody(body []byte, endOfStream bool) Decision {
	st.vm.mu.Lock()
	defer st.vm.mu.Unlock()
	st.phase = phaseResponse
	st.respBody = append([]byte(nil), body...)
	st.respBodyAvail = true
	return st.run(st.vm.fns.responseBody, uint64(len(body)), endOfStream)
}

// run calls a stream callback (skipped when not exported) and settles the
// outcome. vm.mu is held.
func (st *Stream) run(fn api.Function, n uint64, endOfStream bool) Decision {
	if d, bad := st.failedDecision(); bad {
		st.last = d
		return d
	}
	st.verdict, st.paused = verdictNone, false
	action := ActionContinue
	if fn != nil {
		eos := uint64(0)
		if endOfStream {
			eos = 1
		}
		r, err := st.vm.callContext(st, fn, uint64(st.id), n, eos)
		if err != nil {
			st.last = Decision{Kind: DecisionFailed, Err: err}
			return st.last
		}
		action = Action(uint32(r))
	}
	st.last = st.settle(action)
	return st.last
}

// settle turns a callback's action and any verdict the guest reached during
// the callback into a Decision. A local response or a reset wins over the
// returned action, as in Envoy (stopNextIteration). vm.mu is held.
func (st *Stream) settle(action Action) Decision {
	switch {
	case st.verdict == verdictLocal:
		st.closePhase()
		return Decision{Kind: DecisionLocalResponse, Local: st.local}
	case st.verdict == verdictReset || st.resetAsked:
		st.closePhase()
		return Decision{Kind: DecisionReset}
	case action == ActionContinue || st.verdict == verdictContinue:
		st.closePhase()
		return Decision{Kind: DecisionContinue}
	}
	st.paused = true
	return Decision{Kind: DecisionPause}
}

// closePhase ends the current phase: its maps and buffers stop being
// writable, as Envoy drops its pointers to them. vm.mu is held.
func (st *Stream) closePhase() {
	st.paused = false
	st.verdict = verdictNone
	switch st.phase {
	case phaseRequest:
		st.reqWritable, st.reqBodyAvail = false, false
	case phaseResponse:
		st.respWritable, st.respBodyAvail = false, false
	}
}

// Await waits while the stream is paused, until the filter continues it,
// sends a local response or resets it (typically from
// proxy_on_http_call_response), the VM fails, or ctx ends (DecisionTimeout:
// the stream is then abandoned and later continues are ignored). On a stream
// that is not paused it returns the latest decision.
func (st *Stream) Await(ctx context.Context) Decision {
	vm := st.vm
	for {
		vm.mu.Lock()
		if d, done := st.poll(); done {
			vm.mu.Unlock()
			return d
		}
		vm.mu.Unlock()
		select {
		case <-st.signal:
		case <-ctx.Done():
			vm.mu.Lock()
			d, done := st.poll()
			if !done {
				st.closePhase()
				d = Decision{Kind: DecisionTimeout, Err: ctx.Err()}
				st.last = d
			}
			vm.mu.Unlock()
			return d
		}
	}
}

// poll reports whether a paused stream has been decided. vm.mu is held.
func (st *Stream) poll() (Decision, bool) {
	if !st.paused {
		return st.last, true
	}
	if d, bad := st.failedDecision(); bad {
		st.paused = false
		st.last = d
		return d, true
	}
	if st.verdict == verdictNone && !st.resetAsked {
		return Decision{}, false
	}
	st.last = st.settle(ActionPause)
	return st.last, true
}

// wake nudges Await. vm.mu is held.
func (st *Stream) wake() {
	select {
	case st.signal <- struct{}{}:
	default:
	}
}

// resume is proxy_continue_stream for this stream. vm.mu is held.
func (st *Stream) resume(t StreamType) {
	want := phaseRequest
	if t == StreamResponse {
		want = phaseResponse
	}
	if st.phase != want || !(st.inCallback || st.paused) {
		return
	}
	if st.verdict == verdictNone {
		st.verdict = verdictContinue
	}
	if t == StreamRequest {
		// Envoy's continueStream drops the request headers and body at once.
		st.reqWritable, st.reqBodyAvail = false, false
	}
	st.wake()
}

// sendLocal is proxy_send_local_response for this stream. vm.mu is held.
func (st *Stream) sendLocal(lr *LocalResponse) {
	switch {
	case st.localReply:
		st.vm.log(LogWarn, fmt.Sprintf("proxy_send_local_response on stream %d ignored: the response is already a local reply", st.id))
		return
	case st.phase != phaseRequest && st.phase != phaseResponse, !(st.inCallback || st.paused):
		st.vm.log(LogWarn, fmt.Sprintf("proxy_send_local_response on stream %d ignored: the stream is not being filtered (forwarded upstream or finished)", st.id))
		return
	}
	if st.verdict != verdictReset {
		st.verdict, st.local = verdictLocal, lr
	}
	st.wake()
}

// reset is proxy_close_stream for this stream. vm.mu is held.
func (st *Stream) reset() {
	st.resetAsked = true
	if st.inCallback || st.paused {
		st.verdict = verdictReset
	}
	st.wake()
}

// ResetRequested reports whether the filter called proxy_close_stream.
func (st *Stream) ResetRequested() bool {
	st.vm.mu.Lock()
	defer st.vm.mu.Unlock()
	return st.resetAsked
}

// Request returns a copy of the request headers as the filter left them.
func (st *Stream) Request() Headers {
	st.vm.mu.Lock()
	defer st.vm.mu.Unlock()
	return st.req.Clone()
}

// Response returns a copy of the response headers as the filter left them.
func (st *Stream) Response() Headers {
	st.vm.mu.Lock()
	defer st.vm.mu.Unlock()
	return st.resp.Clone()
}

// RequestBodyBytes returns a copy of the request body as the filter left it.
func (st *Stream) RequestBodyBytes() []byte {
	st.vm.mu.Lock()
	defer st.vm.mu.Unlock()
	return append([]byte(nil), st.reqBody...)
}

// ResponseBodyBytes returns a copy of the response body as the filter left it.
func (st *Stream) ResponseBodyBytes() []byte {
	st.vm.mu.Lock()
	defer st.vm.mu.Unlock()
	return append([]byte(nil), st.respBody...)
}

// forwarded records that the request went upstream to addr.
func (st *Stream) forwarded(addr string) {
	st.vm.mu.Lock()
	defer st.vm.mu.Unlock()
	st.phase = phaseForward
	st.upstreamAddr = addr
}

// Finish ends the stream like Envoy at the end of a request: proxy_on_log
// (request and response headers readable), proxy_on_done, proxy_on_delete.
// It is safe to call more than once.
func (st *Stream) Finish() {
	vm := st.vm
	vm.mu.Lock()
	defer vm.mu.Unlock()
	if st.finished {
		return
	}
	st.closePhase()
	st.phase = phaseDone
	if vm.failed == nil && !vm.closed {
		if vm.fns.log != nil {
			st.inLog = true
			_, _ = vm.callContext(st, vm.fns.log, uint64(st.id))
			st.inLog = false
		}
		if vm.fns.done != nil {
			_, _ = vm.callContext(st, vm.fns.done, uint64(st.id))
		}
		if vm.fns.delete != nil {
			_, _ = vm.callContext(st, vm.fns.delete, uint64(st.id))
		}
	}
	st.finished = true
	delete(vm.streams, st.id)
}
