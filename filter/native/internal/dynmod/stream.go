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
	// Destroy runs last: the Stream is invalid once it returns.
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

// Config returns the stream's filter configuration.
func (s *Stream) Config() *Config { return s.config }

// WorkerIndex returns the index of the stream's worker thread, from 0 to
// Envoy's concurrency - 1.
func (s *Stream) WorkerIndex() int {
	return int(C.dm_http_filter_get_worker_index(s.envoy))
}

// Header returns a copy of the value of the header name (lower case) in the
// map kind, the first one if it has several.
func (s *Stream) Header(kind HeaderKind, name string) (string, bool) {
	v, ok := s.headerView(kind, name, 0)
	return strings.Clone(v), ok
}

// AppendHeader appends the value of the header name to dst: Header without
// an allocation when dst has room.
func (s *Stream) AppendHeader(dst []byte, kind HeaderKind, name string) ([]byte, bool) {
	v, ok := s.headerView(kind, name, 0)
	return append(dst, v...), ok
}

// HeaderView returns the value of the header name without copying it: a
// view of Envoy's memory, valid until the hook returns or a header of the
// map is set, whichever comes first. For a caller that reads a header
// during a hook and copies what it keeps.
func (s *Stream) HeaderView(kind HeaderKind, name string) (string, bool) {
	return s.headerView(kind, name, 0)
}

// HeaderValues returns a copy of every value of the header name.
func (s *Stream) HeaderValues(kind HeaderKind, name string) []string {
	var n C.size_t
	var b C.dm_buf
	if !C.dm_http_get_header(s.envoy, C.dm_enum(kind), strBuf(name), &b, 0, &n) {
		return nil
	}
	out := make([]string, 0, int(n))
	out = append(out, strings.Clone(view(b)))
	for i := 1; i < int(n); i++ {
		v, _ := s.headerView(kind, name, i)
		out = append(out, strings.Clone(v))
	}
	return out
}

// headerView returns the index-th value of name in Envoy's memory.
func (s *Stream) headerView(kind HeaderKind, name string, index int) (string, bool) {
	var b C.dm_buf
	if !C.dm_http_get_header(s.envoy, C.dm_enum(kind), strBuf(name), &b, C.size_t(index), nil) {
		return "", false
	}
	return view(b), true
}

// Headers returns a copy of every header of the map kind, in order.
func (s *Stream) Headers(kind HeaderKind) []Header {
	n := C.dm_http_get_headers_size(s.envoy, C.dm_enum(kind))
	if n == 0 {
		return nil
	}
	hs := make([]C.dm_header, int(n))
	if !C.dm_http_get_headers(s.envoy, C.dm_enum(kind), &hs[0]) {
		return nil
	}
	out := make([]Header, len(hs))
	for i := range hs {
		out[i] = Header{strings.Clone(headerName(&hs[i])), strings.Clone(headerValue(&hs[i]))}
	}
	return out
}

// AddHeader adds a value to the header name of the map kind, keeping the
// values it has; an empty value adds nothing. It reports whether the map
// exists at this point of the stream.
func (s *Stream) AddHeader(kind HeaderKind, name, value string) bool {
	return bool(C.dm_http_add_header(s.envoy, C.dm_enum(kind), strBuf(name), strBuf(value)))
}

// SetHeader replaces the values of the header name with value; an empty
// value removes the header.
func (s *Stream) SetHeader(kind HeaderKind, name, value string) bool {
	return bool(C.dm_http_set_header(s.envoy, C.dm_enum(kind), strBuf(name), strBuf(value)))
}

// RemoveHeader removes the header name.
func (s *Stream) RemoveHeader(kind HeaderKind, name string) bool {
	return s.SetHeader(kind, name, "")
}

// BodySize returns the size of the body kind (0 if there is none now).
func (s *Stream) BodySize(kind BodyKind) int {
	return int(C.dm_http_get_body_size(s.envoy, C.dm_enum(kind)))
}

// AppendBody appends the body kind to dst, at most limit bytes, and reports
// whether it fit whole. The received body exists only in a body hook; the
// buffered one is what Envoy holds after the hooks returned BodyStopBuffer.
func (s *Stream) AppendBody(dst []byte, kind BodyKind, limit int) ([]byte, bool) {
	return s.AppendBodyRange(dst, kind, 0, limit)
}

// AppendBodyRange is AppendBody from offset start of the body: the bytes
// before it are skipped, not copied.
func (s *Stream) AppendBodyRange(dst []byte, kind BodyKind, start, limit int) ([]byte, bool) {
	n := int(C.dm_http_get_body_chunks_size(s.envoy, C.dm_enum(kind)))
	if n == 0 {
		return dst, true
	}
	if cap(s.chunks) < n {
		s.chunks = make([]C.dm_buf, n)
	}
	chunks := s.chunks[:n]
	if !C.dm_http_get_body_chunks(s.envoy, C.dm_enum(kind), &chunks[0]) {
		return dst, true
	}
	for i, c := range chunks {
		if int(c.length) > start {
			c.ptr = (*C.char)(unsafe.Add(unsafe.Pointer(c.ptr), start))
			c.length -= C.size_t(start)
			chunks[i] = c
			return appendChunks(dst, chunks[i:], limit)
		}
		start -= int(c.length)
	}
	return dst, true
}

// ReplaceBody replaces the whole of body kind with data; false when the
// stream has no such body now (outside its hook).
func (s *Stream) ReplaceBody(kind BodyKind, data []byte) bool {
	if !C.dm_http_drain_body(s.envoy, C.dm_enum(kind), C.size_t(s.BodySize(kind))) {
		return false
	}
	if len(data) == 0 {
		return true
	}
	return bool(C.dm_http_append_body(s.envoy, C.dm_enum(kind), bytesBuf(data)))
}

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
