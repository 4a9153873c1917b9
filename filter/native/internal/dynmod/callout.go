package dynmod

/*
#include "dynmod.h"
*/
import "C"

import (
	"strconv"
	"strings"
	"time"
)

// CalloutResult is how a callout ended.
type CalloutResult int32

// The callout results (envoy_dynamic_module_type_http_callout_result).
const (
	CalloutSuccess      CalloutResult = 0 // an answer came, whatever its status
	CalloutReset        CalloutResult = 1 // no answer: reset, refused, timed out
	CalloutBodyTooLarge CalloutResult = 2 // the answer exceeded Envoy's buffer limit
)

// String names the result.
func (r CalloutResult) String() string {
	switch r {
	case CalloutSuccess:
		return "success"
	case CalloutReset:
		return "reset"
	case CalloutBodyTooLarge:
		return "body too large"
	}
	return "result " + strconv.Itoa(int(r))
}

// CalloutError is why Envoy did not start a callout
// (envoy_dynamic_module_type_http_callout_init_result).
type CalloutError int32

// The reasons a callout is not started.
const (
	ErrMissingHeaders  CalloutError = 1 // :method, :path or host missing
	ErrClusterNotFound CalloutError = 2 // no such cluster
	ErrDuplicateID     CalloutError = 3
	ErrCannotCreate    CalloutError = 4 // e.g. no healthy upstream host
)

// Error describes the reason.
func (e CalloutError) Error() string {
	switch e {
	case ErrMissingHeaders:
		return "callout: missing :method, :path or host header"
	case ErrClusterNotFound:
		return "callout: cluster not found"
	case ErrDuplicateID:
		return "callout: duplicate callout id"
	case ErrCannotCreate:
		return "callout: cannot create the request"
	}
	return "callout: init result " + strconv.Itoa(int(e))
}

// calloutErr turns an init result into an error (nil for success).
func calloutErr(r C.dm_enum) error {
	if r == 0 {
		return nil
	}
	return CalloutError(r)
}

// timeoutMs is d in whole milliseconds, at least 1: Envoy reads 0 as no
// timeout.
func timeoutMs(d time.Duration) C.uint64_t {
	return C.uint64_t(max(1, d.Milliseconds()))
}

// Response is a callout's answer as done receives it: a view of Envoy's
// memory, valid only while done runs. Its methods copy what they return.
type Response struct {
	Result  CalloutResult
	headers []C.dm_header
	body    []C.dm_buf
}

// newResponse views the answer Envoy handed to a callout_done hook.
func newResponse(result C.dm_enum, headers *C.dm_header, nh C.size_t, body *C.dm_buf, nb C.size_t) Response {
	return Response{Result: CalloutResult(result), headers: envoyHeaders(headers, nh), body: envoyBufs(body, nb)}
}

// Header returns a copy of the first value of the header name (lower case).
func (r *Response) Header(name string) (string, bool) {
	for i := range r.headers {
		if headerName(&r.headers[i]) == name {
			return strings.Clone(headerValue(&r.headers[i])), true
		}
	}
	return "", false
}

// Status returns the answer's :status, or 0.
func (r *Response) Status() int {
	for i := range r.headers {
		if headerName(&r.headers[i]) == ":status" {
			n, _ := strconv.Atoi(headerValue(&r.headers[i]))
			return n
		}
	}
	return 0
}

// Headers returns a copy of every header of the answer.
func (r *Response) Headers() []Header {
	out := make([]Header, len(r.headers))
	for i := range r.headers {
		out[i] = Header{strings.Clone(headerName(&r.headers[i])), strings.Clone(headerValue(&r.headers[i]))}
	}
	return out
}

// BodySize returns the size of the answer's body.
func (r *Response) BodySize() int {
	n := 0
	for _, b := range r.body {
		n += int(b.length)
	}
	return n
}

// AppendBody appends the answer's body to dst, at most limit bytes, and
// reports whether the whole body fit.
func (r *Response) AppendBody(dst []byte, limit int) ([]byte, bool) {
	return appendChunks(dst, r.body, limit)
}

// appendChunks appends Envoy's chunks to dst up to limit bytes and reports
// whether all of them fit.
func appendChunks(dst []byte, chunks []C.dm_buf, limit int) ([]byte, bool) {
	for _, c := range chunks {
		v := view(c)
		if len(v) > limit {
			return append(dst, v[:limit]...), false
		}
		dst = append(dst, v...)
		limit -= len(v)
	}
	return dst, true
}

// Callout sends an HTTP request to cluster (headers must include :method,
// :path and host or :authority) and calls done with the answer on this
// stream's worker, in the callout_done hook, unless the stream is destroyed
// first (Envoy then cancels the call). An error means no call was made and
// done will not run.
func (s *Stream) Callout(cluster string, headers []Header, body []byte, timeout time.Duration, done func(*Response)) error {
	hp, n := s.arena.headers(headers)
	var id C.uint64_t
	r := C.dm_http_filter_http_callout(s.envoy, &id, strBuf(cluster), hp, n, bytesBuf(body), timeoutMs(timeout))
	if err := calloutErr(r); err != nil {
		return err
	}
	if s.calls == nil {
		s.calls = map[uint64]func(*Response){}
	}
	s.calls[uint64(id)] = done
	return nil
}

// Callout sends an HTTP request to cluster on behalf of the configuration,
// not of a stream (a renewal, a settlement), and calls done with the answer
// on the main thread. Call it on the main thread only: from a function
// Post runs. The call is cancelled if the configuration is dropped first.
func (c *Config) Callout(cluster string, headers []Header, body []byte, timeout time.Duration, done func(*Response)) error {
	hp, n := c.arena.headers(headers)
	var id C.uint64_t
	r := C.dm_http_filter_config_http_callout(c.envoy, &id, strBuf(cluster), hp, n, bytesBuf(body), timeoutMs(timeout))
	if err := calloutErr(r); err != nil {
		return err
	}
	c.calls[uint64(id)] = done
	return nil
}
