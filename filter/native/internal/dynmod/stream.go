package dynmod

/*
#include "dynmod.h"
*/
import "C"

import (
	"strings"
	"unsafe"
)

// StreamHandler handles one HTTP stream's events, on its worker thread.
// Embed PassThrough for the hooks a handler does not need.
type StreamHandler interface {
	RequestHeaders(endOfStream bool) HeadersStatus
	RequestBody(endOfStream bool) BodyStatus
	RequestTrailers() TrailersStatus
	ResponseHeaders(endOfStream bool) HeadersStatus
	ResponseBody(endOfStream bool) BodyStatus
	ResponseTrailers() TrailersStatus
	// Complete runs once the stream is over (before Envoy's access logs);
	// the stream's state is still readable.
	Complete()
	// Destroy runs last, right after Complete when no callout of the
	// stream is in flight, else when Envoy destroys the filter: the Stream
	// is invalid once it returns.
	Destroy()
}

// PassThrough is a StreamHandler that lets everything through; embed it and
// override the hooks a handler needs.
type PassThrough struct{}

// RequestHeaders continues.
func (PassThrough) RequestHeaders(bool) HeadersStatus { return HeadersContinue }

// RequestBody continues.
func (PassThrough) RequestBody(bool) BodyStatus { return BodyContinue }

// RequestTrailers continues.
func (PassThrough) RequestTrailers() TrailersStatus { return TrailersContinue }

// ResponseHeaders continues.
func (PassThrough) ResponseHeaders(bool) HeadersStatus { return HeadersContinue }

// ResponseBody continues.
func (PassThrough) ResponseBody(bool) BodyStatus { return BodyContinue }

// ResponseTrailers continues.
func (PassThrough) ResponseTrailers() TrailersStatus { return TrailersContinue }

// Complete does nothing.
func (PassThrough) Complete() {}

// Destroy does nothing.
func (PassThrough) Destroy() {}

// Stream is Envoy's side of one HTTP stream (DynamicModuleHttpFilter). Its
// methods may be called only on the stream's worker thread, during one of
// its hooks or a function its Scheduler runs.
type Stream struct {
	envoy   unsafe.Pointer // Envoy's filter, valid until the destroy hook
	c       *C.dm_stream   // what Envoy holds for the stream (C memory), until released
	config  *Config
	handler StreamHandler // nil: the stream passes through (none, or it panicked)

	// The directions the handler holds (returned a Stop status and has not
	// continued): a panic resumes them. replied: the handler answered the
	// request locally, so nothing is held.
	requestHeld, responseHeld, replied bool

	calls  map[uint64]func(*Response) // callouts in flight
	sched  *Scheduler                 // made by Scheduler
	arena  cArena                     // the headers of callouts and local replies
	chunks []C.dm_buf                 // AppendBodyRange's scratch
}

// Hook names the stream hooks a handler may skip (Stream.Skip).
type Hook uint32

// The hooks a handler may skip.
const (
	HookRequestBody      Hook = C.DM_SKIP_REQUEST_BODY
	HookRequestTrailers  Hook = C.DM_SKIP_REQUEST_TRAILERS
	HookResponseHeaders  Hook = C.DM_SKIP_RESPONSE_HEADERS
	HookResponseBody     Hook = C.DM_SKIP_RESPONSE_BODY
	HookResponseTrailers Hook = C.DM_SKIP_RESPONSE_TRAILERS
)

// Skip makes Envoy's later calls of the hooks h continue the stream without
// calling the handler: each call saved is a crossing from Envoy into Go.
func (s *Stream) Skip(h Hook) {
	if s.c != nil {
		s.c.skip |= C.uint32_t(h)
	}
}

// Config returns the stream's filter configuration.
func (s *Stream) Config() *Config { return s.config }

// WorkerIndex returns the index of the stream's worker thread, from 0 to
// Envoy's concurrency - 1.
func (s *Stream) WorkerIndex() int {
	return int(C.dm_http_filter_get_worker_index(s.envoy))
}

// Headers returns the stream's header map kind, read and changed in a
// hook of the stream.
func (s *Stream) Headers(kind HeaderKind) HeaderMap { return HeaderMap{envoy: s.envoy, kind: kind} }

// Body returns the stream's body kind, read and changed in a hook of the
// stream.
func (s *Stream) Body(kind BodyKind) Body { return Body{s: s, kind: kind} }

// SendReply answers the request locally: status, headers, body, and details
// (the response code details of Envoy's access log, e.g. "rate_limited").
// The response hooks do not run for it.
func (s *Stream) SendReply(status int, headers []Header, body []byte, details string) {
	hp, n := s.arena.headers(headers)
	C.dm_http_send_response(s.envoy, C.uint32_t(status), hp, n, bytesBuf(body), strBuf(details))
	s.replied, s.requestHeld, s.responseHeld = true, false, false
}

// ContinueRequest resumes a request the handler holds.
func (s *Stream) ContinueRequest() {
	s.requestHeld = false
	C.dm_http_filter_continue_decoding(s.envoy)
}

// ContinueResponse resumes a response the handler holds.
func (s *Stream) ContinueResponse() {
	s.responseHeld = false
	C.dm_http_filter_continue_encoding(s.envoy)
}

// Attribute returns a copy of the attribute id as a string.
func (s *Stream) Attribute(id Attribute) (string, bool) {
	var b C.dm_buf
	if !C.dm_http_filter_get_attribute_string(s.envoy, C.dm_enum(id), &b) {
		return "", false
	}
	return strings.Clone(view(b)), true
}

// AttributeView returns the attribute id as a string without copying it:
// valid until the hook returns.
func (s *Stream) AttributeView(id Attribute) (string, bool) {
	var b C.dm_buf
	if !C.dm_http_filter_get_attribute_string(s.envoy, C.dm_enum(id), &b) {
		return "", false
	}
	return view(b), true
}

// AttributeInt returns the attribute id as an integer.
func (s *Stream) AttributeInt(id Attribute) (uint64, bool) {
	var v C.uint64_t
	ok := C.dm_http_filter_get_attribute_int(s.envoy, C.dm_enum(id), &v)
	return uint64(v), bool(ok)
}

// MetadataNumber returns the number at namespace ns, key key of the
// metadata source.
func (s *Stream) MetadataNumber(source MetadataSource, ns, key string) (float64, bool) {
	var v C.double
	ok := C.dm_http_get_metadata_number(s.envoy, C.dm_enum(source), strBuf(ns), strBuf(key), &v)
	return float64(v), bool(ok)
}

// MetadataString returns a copy of the string at namespace ns, key key of
// the metadata source.
func (s *Stream) MetadataString(source MetadataSource, ns, key string) (string, bool) {
	var b C.dm_buf
	if !C.dm_http_get_metadata_string(s.envoy, C.dm_enum(source), strBuf(ns), strBuf(key), &b) {
		return "", false
	}
	return strings.Clone(view(b)), true
}

// SetMetadataNumber sets a number in the stream's dynamic metadata.
func (s *Stream) SetMetadataNumber(ns, key string, v float64) {
	C.dm_http_set_dynamic_metadata_number(s.envoy, strBuf(ns), strBuf(key), C.double(v))
}

// SetMetadataString sets a string in the stream's dynamic metadata.
func (s *Stream) SetMetadataString(ns, key, v string) {
	C.dm_http_set_dynamic_metadata_string(s.envoy, strBuf(ns), strBuf(key), strBuf(v))
}

// Scheduler returns the stream's scheduler, made on first use: any
// goroutine may then Post functions to run on the stream's worker, until the
// stream is destroyed.
func (s *Stream) Scheduler() *Scheduler {
	if s.sched == nil {
		s.sched = &Scheduler{}
		s.sched.open(C.dm_http_filter_scheduler_new(s.envoy), false)
	}
	return s.sched
}
