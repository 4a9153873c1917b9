package dynmod

/*
#include "dynmod.h"
*/
import "C"

import "runtime/cgo"

// The stream hooks' Go side (hooks.c calls it). Each finds its Stream
// from the dm_stream Envoy holds, made at the first hook that enters Go,
// and recovers any panic of the handler: the hook then answers Continue,
// the stream goes on without its handler, and what the handler held is
// resumed.

// streamOf returns the Stream of cs, made (with its handler) if it has none
// yet; nil (and a report) if cs's handle is not one.
func streamOf(cs *C.dm_stream) (s *Stream) {
	if cs.handle == 0 {
		s = &Stream{envoy: cs.envoy, c: cs}
		attachHandler(s, cs.config)
		cs.handle = C.uintptr_t(cgo.NewHandle(s))
		return s
	}
	defer func() {
		if v := recover(); v != nil {
			reportPanic("stream handle", v)
			s = nil
		}
	}()
	return cgo.Handle(cs.handle).Value().(*Stream)
}

// guard, deferred by a hook, recovers a panic of the handler: the hook's
// status stays 0 (Continue) and the stream fails.
func (s *Stream) guard(hook string) {
	if v := recover(); v != nil {
		s.fail(hook, v)
	}
}

// fail detaches a stream's handler after it panicked in hook, and resumes
// what it held.
func (s *Stream) fail(hook string, v any) {
	s.handler = nil
	s.calls = nil
	if s.requestHeld {
		s.ContinueRequest()
	}
	if s.responseHeld {
		s.ContinueResponse()
	}
	reportPanic(hook, v)
}

// attachHandler asks the configuration of handle config for the handler
// of s. A handler that panicked at birth leaves a stream that passes
// through (Envoy would close a stream without one).
func attachHandler(s *Stream, config C.uintptr_t) {
	defer func() {
		if v := recover(); v != nil {
			s.handler = nil
			reportPanic("http_filter_new", v)
		}
	}()
	s.config = configOf(config)
	s.handler = s.config.handler.NewStream(s)
}

// status is what every request and response hook returns: its status
// type, whose zero is Continue.
type status interface {
	~int32
}

// direction tells which way a hook's status holds the stream.
type direction bool

const (
	request  direction = false
	response direction = true
)

// runHook calls a request or response hook of the stream of cs, records
// whether it holds the stream's direction dir, and answers Continue when
// the stream has no handler or the hook panicked.
func runHook[S status](cs *C.dm_stream, hook string, dir direction, call func(StreamHandler) S) (st C.dm_enum) {
	s := streamOf(cs)
	if s == nil || s.handler == nil {
		return 0
	}
	defer s.guard(hook)
	r := call(s.handler)
	// A stream answered locally is held by nothing: a panic must not
	// resume it.
	held := r != 0 && !s.replied
	if dir == request {
		s.requestHeld = held
	} else {
		s.responseHeld = held
	}
	return C.dm_enum(r)
}

//export dm_go_request_headers
func dm_go_request_headers(cs *C.dm_stream, end C.bool) C.dm_enum {
	return runHook(cs, "request_headers", request, func(sh StreamHandler) HeadersStatus { return sh.RequestHeaders(bool(end)) })
}

//export dm_go_request_body
func dm_go_request_body(cs *C.dm_stream, end C.bool) C.dm_enum {
	return runHook(cs, "request_body", request, func(sh StreamHandler) BodyStatus { return sh.RequestBody(bool(end)) })
}

//export dm_go_request_trailers
func dm_go_request_trailers(cs *C.dm_stream) C.dm_enum {
	return runHook(cs, "request_trailers", request, StreamHandler.RequestTrailers)
}

//export dm_go_response_headers
func dm_go_response_headers(cs *C.dm_stream, end C.bool) C.dm_enum {
	return runHook(cs, "response_headers", response, func(sh StreamHandler) HeadersStatus { return sh.ResponseHeaders(bool(end)) })
}

//export dm_go_response_body
func dm_go_response_body(cs *C.dm_stream, end C.bool) C.dm_enum {
	return runHook(cs, "response_body", response, func(sh StreamHandler) BodyStatus { return sh.ResponseBody(bool(end)) })
}

//export dm_go_response_trailers
func dm_go_response_trailers(cs *C.dm_stream) C.dm_enum {
	return runHook(cs, "response_trailers", response, StreamHandler.ResponseTrailers)
}

// dm_go_stream_complete runs the handler's Complete, then lets the stream
// go at once when no callout of it is in flight: Envoy calls nothing of it
// after this hook but its destroy, which then does not enter Go.
//
//export dm_go_stream_complete
func dm_go_stream_complete(cs *C.dm_stream) {
	s := streamOf(cs)
	if s == nil {
		return
	}
	if s.handler != nil {
		func() {
			defer s.guard("stream_complete")
			s.handler.Complete()
		}()
	}
	if len(s.calls) == 0 {
		s.release(cs)
	}
}

//export dm_go_destroy
func dm_go_destroy(cs *C.dm_stream) {
	if s := streamOf(cs); s != nil {
		s.release(cs)
	}
}

// release runs the handler's Destroy and frees the stream's resources: cs
// names no Go stream afterwards, and no hook of it enters Go again.
func (s *Stream) release(cs *C.dm_stream) {
	defer func() {
		if v := recover(); v != nil {
			reportPanic("http_filter_destroy", v)
		}
		// Whatever the handler did, the stream's resources go.
		cgo.Handle(cs.handle).Delete()
		cs.handle, cs.released = 0, true
		if s.sched != nil {
			s.sched.close()
		}
		s.arena.free()
		s.calls = nil
		s.envoy, s.c = nil, nil
	}()
	if s.handler != nil {
		s.handler.Destroy()
	}
}

//export dm_go_http_callout_done
func dm_go_http_callout_done(cs *C.dm_stream, id C.uint64_t, result C.dm_enum, headers *C.dm_header, nh C.size_t,
	body *C.dm_buf, nb C.size_t) {
	s := streamOf(cs)
	if s == nil {
		return
	}
	done := s.calls[uint64(id)]
	delete(s.calls, uint64(id))
	if done == nil || s.handler == nil {
		return
	}
	defer s.guard("http_callout_done")
	r := newResponse(result, headers, nh, body, nb)
	done(&r)
}

//export dm_go_scheduled
func dm_go_scheduled(cs *C.dm_stream, event C.uint64_t) {
	s := streamOf(cs)
	if s == nil || s.sched == nil {
		return
	}
	fn := s.sched.take(uint64(event))
	if fn == nil || s.handler == nil {
		return
	}
	defer s.guard("http_filter_scheduled")
	fn()
}
