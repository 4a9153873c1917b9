// Package headermap serializes header maps in the proxy-wasm ABI format
// (used by proxy_send_local_response, proxy_http_call and the map getters).
package headermap

import (
	"encoding/binary"
	"errors"
	"unsafe"
)

// A serialized header map (ABI 0.2.1, little-endian): the number of pairs
// (32 bits); then, per pair, the key's and the value's length (32 bits
// each); then, per pair, the key, a NUL, the value, a NUL.
//
// An empty map is sent as a 4-byte zero count, not as zero bytes: some hosts
// (the tetratelabs proxytest emulator) cannot parse an empty buffer.

// Append appends the serialization of pairs to dst.
func Append(dst []byte, pairs [][2]string) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(pairs)))
	for _, p := range pairs {
		dst = binary.LittleEndian.AppendUint32(dst, uint32(len(p[0])))
		dst = binary.LittleEndian.AppendUint32(dst, uint32(len(p[1])))
	}
	for _, p := range pairs {
		dst = append(dst, p[0]...)
		dst = append(dst, 0)
		dst = append(dst, p[1]...)
		dst = append(dst, 0)
	}
	return dst
}

// ErrMalformed reports a malformed serialized header map.
var ErrMalformed = errors.New("headermap: malformed serialized header map")

// Parse appends the pairs of a serialized map to dst. The strings
// point into data. An empty buffer and a single zero byte are empty maps.
func Parse(dst [][2]string, data []byte) ([][2]string, error) {
	if len(data) == 0 || (len(data) == 1 && data[0] == 0) {
		return dst, nil
	}
	if len(data) < 4 {
		return dst, ErrMalformed
	}
	n := uint64(binary.LittleEndian.Uint32(data))
	sizes := data[4:]
	if n*8 > uint64(len(sizes)) {
		return dst, ErrMalformed
	}
	body := sizes[n*8:]
	for i := uint64(0); i < n; i++ {
		k := uint64(binary.LittleEndian.Uint32(sizes[i*8:]))
		v := uint64(binary.LittleEndian.Uint32(sizes[i*8+4:]))
		if k+v+2 > uint64(len(body)) || body[k] != 0 || body[k+1+v] != 0 {
			return dst, ErrMalformed
		}
		dst = append(dst, [2]string{str(body[:k]), str(body[k+1 : k+1+v])})
		body = body[k+v+2:]
	}
	return dst, nil
}

// str returns b as a string without copying.
func str(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}
