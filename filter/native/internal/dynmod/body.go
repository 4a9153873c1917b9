package dynmod

// #include "dynmod.h"
import "C"

import "unsafe"

// Body is one of a stream's bodies (Stream.Body): the chunk a body hook
// received, or what Envoy buffered.
type Body struct {
	s    *Stream
	kind BodyKind
}

// Size returns the size of the body (0 if there is none now).
func (b Body) Size() int {
	return int(C.dm_http_get_body_size(b.s.envoy, C.dm_enum(b.kind)))
}

// Append appends the body to dst, at most limit bytes, and reports
// whether it fit whole. The received body exists only in a body hook; the
// buffered one is what Envoy holds after the hooks returned BodyStopBuffer.
func (b Body) Append(dst []byte, limit int) ([]byte, bool) {
	return b.AppendRange(dst, 0, limit)
}

// AppendRange is Append from offset start of the body: the bytes
// before it are skipped, not copied.
func (b Body) AppendRange(dst []byte, start, limit int) ([]byte, bool) {
	s := b.s
	n := int(C.dm_http_get_body_chunks_size(s.envoy, C.dm_enum(b.kind)))
	if n == 0 {
		return dst, true
	}
	if cap(s.chunks) < n {
		s.chunks = make([]C.dm_buf, n)
	}
	chunks := s.chunks[:n]
	if !C.dm_http_get_body_chunks(s.envoy, C.dm_enum(b.kind), &chunks[0]) {
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

// Replace replaces the whole body with data; false when the
// stream has no such body now (outside its hook).
func (b Body) Replace(data []byte) bool {
	if !C.dm_http_drain_body(b.s.envoy, C.dm_enum(b.kind), C.size_t(b.Size())) {
		return false
	}
	if len(data) == 0 {
		return true
	}
	return bool(C.dm_http_append_body(b.s.envoy, C.dm_enum(b.kind), bytesBuf(data)))
}
