package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/sluicehq/sluice/filter/core"
	"github.com/sluicehq/sluice/filter/native/internal/dynmod"
)

// stream is one HTTP stream: the dynmod handler of its hooks, which it
// turns into the core's, and the core.Stream of its exchange.
type stream struct {
	ds *dynmod.Stream
	w  *worker
	x  *core.Exchange
	// The fields below are guarded by w.mu.
	sched   *dynmod.Scheduler // made when the request pauses: acts from other threads come through it
	replied bool              // a local reply is queued
	noBody  bool              // the request ended with its headers
	dead    bool              // Envoy destroyed the stream
	// calling says that the stream's own callout (callID) is under way.
	calling  bool
	callID   uint32
	answered func(*dynmod.Response) // s.answer, made once
}

var (
	_ core.Stream          = (*stream)(nil)
	_ dynmod.StreamHandler = (*hooks)(nil)
)

// errElsewhere is the error of a read made off the stream's thread: the
// core reads streams only in their hooks.
var errElsewhere = errors.New("the stream is read off its worker thread")

// errEnded is the error of an act on a stream that ended.
var errEnded = errors.New("the stream ended")

// readable reports whether s may be read now (w.mu held).
func (s *stream) readable() bool { return s.w.onThread && !s.dead }

// RequestHeader implements core.Stream.
func (s *stream) RequestHeader(name string) (string, bool) {
	if !s.readable() {
		return "", false
	}
	return s.ds.Headers(dynmod.RequestHeaders).View(name)
}

// RemoteAddress implements core.Stream: Envoy's source.address.
func (s *stream) RemoteAddress() (string, bool) {
	if !s.readable() {
		return "", false
	}
	return s.ds.AttributeView(dynmod.AttrSourceAddress)
}

// ResponseHeader implements core.Stream.
func (s *stream) ResponseHeader(name string) (string, bool) {
	if !s.readable() {
		return "", false
	}
	return s.ds.Headers(dynmod.ResponseHeaders).View(name)
}

// ResponseTrailer implements core.Stream.
func (s *stream) ResponseTrailer(name string) (string, bool) {
	if !s.readable() {
		return "", false
	}
	return s.ds.Headers(dynmod.ResponseTrailers).View(name)
}

// DynamicMetadata implements core.Stream, serializing as proxy-wasm does:
// a string as its bytes, a number as its 8 little-endian IEEE 754 bytes.
func (s *stream) DynamicMetadata(namespace, key string) ([]byte, bool) {
	if !s.readable() {
		return nil, false
	}
	if v, ok := s.ds.MetadataString(dynmod.DynamicMetadata, namespace, key); ok {
		return []byte(v), true
	}
	if v, ok := s.ds.MetadataNumber(dynmod.DynamicMetadata, namespace, key); ok {
		return binary.LittleEndian.AppendUint64(nil, math.Float64bits(v)), true
	}
	return nil, false
}

// RequestBody implements core.Stream: the body Envoy buffered, then the
// chunk of the current hook.
func (s *stream) RequestBody(start, max int) ([]byte, error) {
	return s.body(dynmod.BufferedRequestBody, dynmod.ReceivedRequestBody, start, max)
}

// ResponseBody implements core.Stream.
func (s *stream) ResponseBody(start, max int) ([]byte, error) {
	return s.body(dynmod.BufferedResponseBody, dynmod.ReceivedResponseBody, start, max)
}

// RequestEnded implements core.Stream.
func (s *stream) RequestEnded() bool { return s.noBody }

// SetResponseBody implements core.Stream: the chunk being delivered,
// drained and written again.
func (s *stream) SetResponseBody(data []byte) error {
	if !s.readable() {
		return errElsewhere
	}
	if !s.ds.Body(dynmod.ReceivedResponseBody).Replace(data) {
		return errors.New("envoy has no response body chunk to change")
	}
	return nil
}

// EndResponse implements core.Stream: ABI 0.2.0 has no callback that ends
// a response early (a local reply after the headers resets the stream),
// so the core empties the later chunks instead.
func (s *stream) EndResponse() bool { return false }

// body returns at most max bytes from offset start of the body: what Envoy
// buffered, then the chunk received. Only those bytes are copied.
func (s *stream) body(buffered, received dynmod.BodyKind, start, max int) ([]byte, error) {
	if !s.readable() {
		return nil, errElsewhere
	}
	if start < 0 || max < 0 {
		return nil, errors.New("negative body range")
	}
	// The buffered body, then the received chunk, read from start into the
	// worker's scratch (valid until the next read, as core.Stream says).
	b := s.w.bodyRead[:0]
	if n := s.ds.Body(buffered).Size(); start < n {
		b, _ = s.ds.Body(buffered).AppendRange(b, start, max)
		start = 0
	} else {
		start -= n
	}
	if len(b) < max {
		b, _ = s.ds.Body(received).AppendRange(b, start, max-len(b))
	}
	s.w.bodyRead = b
	return b, nil
}

// AddRequestHeader implements core.Stream: queued (actions.go).
func (s *stream) AddRequestHeader(name, value string) error {
	return s.queue(actRequestHeader, name, value)
}

// AddResponseHeader implements core.Stream: queued.
func (s *stream) AddResponseHeader(name, value string) error {
	return s.queue(actResponseHeader, name, value)
}

// Resume implements core.Stream: queued.
func (s *stream) Resume() error { return s.queue(actResume, "", "") }

// SendLocalReply implements core.Stream: queued.
func (s *stream) SendLocalReply(status uint32, details string, body, headers []byte) error {
	if s.dead {
		return errEnded
	}
	b := s.w.queue()
	b.add(s, actReply, bytesString(body), bytesString(headers))
	a := &b.acts[len(b.acts)-1]
	a.status, a.details = status, details
	s.replied = true
	return nil
}

// queue queues an act on s (w.mu held).
func (s *stream) queue(kind actKind, x, y string) error {
	if s.dead {
		return errEnded
	}
	s.w.queue().add(s, kind, x, y)
	return nil
}

// answeredFunc returns the function the stream's callouts answer to.
func (s *stream) answeredFunc() func(*dynmod.Response) {
	if s.answered == nil {
		s.answered = s.answer
	}
	return s.answered
}

// hooks is a stream as the dynmod handler of its hooks: another method
// set on the same memory (dynmod's hook names are core.Stream's too).
type hooks stream

// The hooks. Each holds the worker's lock while the core runs (enter),
// then does what the core queued (leave). A panic in the host or the core
// is recovered here: while the request is decided, the core applies the
// failure mode (core.Worker.Recover); elsewhere it is logged, the stream
// going on.

// RequestHeaders decides the request (timed in the sluicetest build).
func (h *hooks) RequestHeaders(end bool) dynmod.HeadersStatus {
	s := (*stream)(h)
	s.noBody = end
	if testReport(s) {
		return dynmod.HeadersStop
	}
	start := testClock()
	st := s.requestHeaders()
	testHookTime(start)
	return st
}

// requestHeaders is RequestHeaders.
func (s *stream) requestHeaders() (st dynmod.HeadersStatus) {
	w := s.w
	w.enter()
	defer w.leave()
	defer func() {
		if r := recover(); r != nil {
			st = status(w.core.Recover(s.x, r))
		}
	}()
	testPanic("request_headers", s)
	action := w.core.RequestHeaders(s.x)
	if action == core.Continue {
		s.skipUnread()
	}
	if action == core.Pause && !s.replied && s.sched == nil {
		s.sched = s.ds.Scheduler()
	}
	if action == core.Pause && s.x.AwaitsBody() {
		return dynmod.HeadersStop // the body hooks then run, the body buffered
	}
	return status(action)
}

// status is a request headers hook's status for a core action.
func status(a core.Action) dynmod.HeadersStatus {
	if a == core.Pause {
		return dynmod.HeadersStopAll
	}
	return dynmod.HeadersContinue
}

// answer takes the answer of the stream's callout, on its thread.
func (s *stream) answer(r *dynmod.Response) {
	w := s.w
	w.enter()
	defer w.leave()
	if !s.calling {
		return
	}
	s.calling = false
	w.deliver(s.callID, r.Result, r, s)
	if !s.x.Undecided() {
		s.skipUnread()
	}
}

// skipUnread has Envoy skip the hooks of the stream, its request decided,
// whose events the core does not read: each one would be a crossing into
// Go for nothing.
func (s *stream) skipUnread() {
	if testKeepsHooks(s) {
		return
	}
	skip := dynmod.HookRequestBody
	headers, body := s.x.ReadsResponse()
	if !headers {
		skip |= dynmod.HookResponseHeaders
	}
	if !body {
		skip |= dynmod.HookResponseBody | dynmod.HookResponseTrailers
	}
	s.ds.Skip(skip)
}

// RequestBody tells the core of a request body chunk.
func (h *hooks) RequestBody(end bool) (st dynmod.BodyStatus) {
	s := (*stream)(h)
	s.inHook("request body", func(w *core.Worker) {
		if w.RequestBody(s.x, s.ds.Body(dynmod.ReceivedRequestBody).Size(), end) == core.Pause {
			st = dynmod.BodyStopBuffer
		}
	})
	return st
}

// RequestTrailers lets the trailers through.
func (h *hooks) RequestTrailers() dynmod.TrailersStatus { return dynmod.TrailersContinue }

// ResponseHeaders adds the rate limit headers and reads usage.
func (h *hooks) ResponseHeaders(end bool) dynmod.HeadersStatus {
	s := (*stream)(h)
	s.inHook("response headers", func(w *core.Worker) {
		testPanic("response_headers", s)
		w.ResponseHeaders(s.x, end)
		s.skipUnread()
	})
	return dynmod.HeadersContinue
}

// ResponseBody counts a response body chunk.
func (h *hooks) ResponseBody(end bool) dynmod.BodyStatus {
	s := (*stream)(h)
	s.inHook("response body", func(w *core.Worker) {
		w.ResponseBody(s.x, s.ds.Body(dynmod.ReceivedResponseBody).Size(), end)
	})
	return dynmod.BodyContinue
}

// ResponseTrailers reads usage from the trailers.
func (h *hooks) ResponseTrailers() dynmod.TrailersStatus {
	s := (*stream)(h)
	s.inHook("response trailers", func(w *core.Worker) { w.ResponseTrailers(s.x) })
	return dynmod.TrailersContinue
}

// Complete tells the core the stream ended.
func (h *hooks) Complete() {
	s := (*stream)(h)
	s.inHook("stream complete", func(w *core.Worker) { w.End(s.x) })
}

// Destroy forgets the stream: its callout, which Envoy cancels, is
// cancelled in the core too, so that the requests waiting for it wake.
func (h *hooks) Destroy() {
	s := (*stream)(h)
	s.inHook("stream destroy", func(w *core.Worker) {
		s.dead = true
		if s.calling {
			s.calling = false
			w.Cancel(s.callID)
		}
		w.Close(s.x)
		s.sched = nil
	})
}

// inHook runs fn on the stream's core worker, in a hook of the stream that
// decides nothing: under the worker's lock, the acts fn queued done after
// it, a panic logged.
func (s *stream) inHook(hook string, fn func(w *core.Worker)) {
	w := s.w
	w.enter()
	defer w.leave()
	defer s.recoverHook(hook)
	fn(w.core)
}

// testPanicHeader names the hook in which a request of a sluicetest build
// makes the host panic (testPanic): request_headers, answer,
// response_headers.
const testPanicHeader = "x-sluice-test-panic"

// recoverHook, deferred, logs a panic of a hook that decides nothing.
func (s *stream) recoverHook(hook string) {
	if r := recover(); r != nil {
		s.w.Log(core.LevelCritical, "sluice: panic in "+hook+": "+fmt.Sprint(r))
	}
}
