package floorcall

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// The framed request is the bare one behind a gRPC frame header: flag 0 and
// the message's length, big-endian.
func TestAppendRequestFraming(t *testing.T) {
	bare := AppendRequest(nil, []byte("alice"), false)
	framed := AppendRequest(nil, []byte("alice"), true)
	if framed[0] != 0 || binary.BigEndian.Uint32(framed[1:5]) != uint32(len(bare)) || !bytes.Equal(framed[5:], bare) {
		t.Fatalf("framed % x, bare % x", framed, bare)
	}
	if !bytes.Contains(bare, []byte("bench")) || !bytes.Contains(bare, []byte("alice")) {
		t.Fatalf("request lacks its domain or user: % x", bare)
	}
}
