package dynmod

/*
#include "dynmod.h"
*/
import "C"

import (
	"runtime/cgo"
	"unsafe"
)

// The stream hooks. Each looks its Stream up by the handle Envoy gives back
// and recovers any panic of the handler: the hook then answers Continue, the
// stream goes on without its handler, and what the handler held is resumed.

// streamOf returns the Stream of a handle Envoy gives back, or nil (and a
// report) if the handle is not one.
func streamOf(h C.uintptr_t) (s *Stream) {
	defer func() {
		if v := recover(); v != nil {
			reportPanic("stream handle", v)
			s = nil
		}
	}()
	return cgo.Handle(h).Value().(*Stream)
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

//export envoy_dynamic_module_on_http_filter_new
func envoy_dynamic_module_on_http_filter_new(config C.uintptr_t, envoy unsafe.Pointer) C.uintptr_t {
	s := &Stream{envoy: envoy}
	attachHandler(s, config)
	return C.uintptr_t(cgo.NewHandle(s))
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

// runHook calls a request or response hook of the stream of handle h,
// records whether it holds the stream's direction dir, and answers Continue
// when the stream has no handler or the hook panicked.
func runHook[S status](h C.uintptr_t, hook string, dir direction, call func(StreamHandler) S) (st C.dm_enum) {
	s := streamOf(h)
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

//export envoy_dynamic_module_on_http_filter_request_headers
func envoy_dynamic_module_on_http_filter_request_headers(envoy unsafe.Pointer, h C.uintptr_t, end C.bool) C.dm_enum {
	return runHook(h, "request_headers", request, func(sh StreamHandler) HeadersStatus { return sh.RequestHeaders(bool(end)) })
}

//export envoy_dynamic_module_on_http_filter_request_body
func envoy_dynamic_module_on_http_filter_request_body(envoy unsafe.Pointer, h C.uintptr_t, end C.bool) C.dm_enum {
	return runHook(h, "request_body", request, func(sh StreamHandler) BodyStatus { return sh.RequestBody(bool(end)) })
}

//export envoy_dynamic_module_on_http_filter_request_trailers
func envoy_dynamic_module_on_http_filter_request_trailers(envoy unsafe.Pointer, h C.uintptr_t) C.dm_enum {
	return runHook(h, "request_trailers", request, StreamHandler.RequestTrailers)
}

//export envoy_dynamic_module_on_http_filter_response_headers
func envoy_dynamic_module_on_http_filter_response_headers(envoy unsafe.Pointer, h C.uintptr_t, end C.bool) C.dm_enum {
	return runHook(h, "response_headers", response, func(sh StreamHandler) HeadersStatus { return sh.ResponseHeaders(bool(end)) })
}

//export envoy_dynamic_module_on_http_filter_response_body
func envoy_dynamic_module_on_http_filter_response_body(envoy unsafe.Pointer, h C.uintptr_t, end C.bool) C.dm_enum {
	return runHook(h, "response_body", response, func(sh StreamHandler) BodyStatus { return sh.ResponseBody(bool(end)) })
}

//export envoy_dynamic_module_on_http_filter_response_trailers
func envoy_dynamic_module_on_http_filter_response_trailers(envoy unsafe.Pointer, h C.uintptr_t) C.dm_enum {
	return runHook(h, "response_trailers", response, StreamHandler.ResponseTrailers)
}

//export envoy_dynamic_module_on_http_filter_stream_complete
func envoy_dynamic_module_on_http_filter_stream_complete(envoy unsafe.Pointer, h C.uintptr_t) {
	s := streamOf(h)
	if s == nil || s.handler == nil {
		return
	}
	defer s.guard("stream_complete")
	s.handler.Complete()
}

//export envoy_dynamic_module_on_http_filter_destroy
func envoy_dynamic_module_on_http_filter_destroy(h C.uintptr_t) {
	s := streamOf(h)
	if s == nil {
		return
	}
	defer func() {
		if v := recover(); v != nil {
			reportPanic("http_filter_destroy", v)
		}
		// Whatever the handler did, the stream's resources go: Envoy never
		// names this handle again.
		cgo.Handle(h).Delete()
		if s.sched != nil {
			s.sched.close()
		}
		s.arena.free()
		s.calls = nil
		s.envoy = nil
	}()
	if s.handler != nil {
		s.handler.Destroy()
	}
}

//export envoy_dynamic_module_on_http_filter_http_callout_done
func envoy_dynamic_module_on_http_filter_http_callout_done(envoy unsafe.Pointer, h C.uintptr_t, id C.uint64_t,
	result C.dm_enum, headers *C.dm_header, nh C.size_t, body *C.dm_buf, nb C.size_t) {
	s := streamOf(h)
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

//export envoy_dynamic_module_on_http_filter_scheduled
func envoy_dynamic_module_on_http_filter_scheduled(envoy unsafe.Pointer, h C.uintptr_t, event C.uint64_t) {
	s := streamOf(h)
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

// The hooks below are required by Envoy's loader but unused: the module
// makes no streamed callouts and is never a terminal filter.

//export envoy_dynamic_module_on_http_filter_http_stream_headers
func envoy_dynamic_module_on_http_filter_http_stream_headers(envoy unsafe.Pointer, h C.uintptr_t, id C.uint64_t,
	headers *C.dm_header, n C.size_t, end C.bool) {
}

//export envoy_dynamic_module_on_http_filter_http_stream_data
func envoy_dynamic_module_on_http_filter_http_stream_data(envoy unsafe.Pointer, h C.uintptr_t, id C.uint64_t,
	data *C.dm_buf, n C.size_t, end C.bool) {
}

//export envoy_dynamic_module_on_http_filter_http_stream_trailers
func envoy_dynamic_module_on_http_filter_http_stream_trailers(envoy unsafe.Pointer, h C.uintptr_t, id C.uint64_t,
	trailers *C.dm_header, n C.size_t) {
}

//export envoy_dynamic_module_on_http_filter_http_stream_complete
func envoy_dynamic_module_on_http_filter_http_stream_complete(envoy unsafe.Pointer, h C.uintptr_t, id C.uint64_t) {
}

//export envoy_dynamic_module_on_http_filter_http_stream_reset
func envoy_dynamic_module_on_http_filter_http_stream_reset(envoy unsafe.Pointer, h C.uintptr_t, id C.uint64_t, reason C.dm_enum) {
}

//export envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark
func envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(envoy unsafe.Pointer, h C.uintptr_t) {
}

//export envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark
func envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(envoy unsafe.Pointer, h C.uintptr_t) {
}
