package server

import (
	"encoding/binary"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/controlplane/internal/connbounds"
)

// frame returns an HTTP/2 frame with an empty payload of length bytes.
func frame(typ, flags byte, stream uint32, length int) []byte {
	f := make([]byte, 9+length)
	f[0], f[1], f[2] = byte(length>>16), byte(length>>8), byte(length)
	f[3], f[4] = typ, flags
	binary.BigEndian.PutUint32(f[5:], stream)
	return f
}

// TestFrameGuard: what each flood makes the guard say, read in pieces of
// every size, and that a client that behaves is left alone.
func TestFrameGuard(t *testing.T) {
	preface := []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
	settings := frame(frameSettings, 0, 0, 6)
	tests := []struct {
		name string
		// build returns the client's bytes; tap says whether the blocks
		// reach the tap handle.
		build func() []byte
		tap   bool
		want  string // the reason, or "" for none
	}{
		{"a normal client: 5,000 calls, a few reset", func() []byte {
			b := append(append([]byte{}, preface...), settings...)
			for i := range 5000 {
				id := uint32(2*i + 1)
				b = append(b, frame(frameHeaders, flagEndHeaders, id, 40)...)
				b = append(b, frame(frameData, 1, id, 20)...)
				if i%10 == 0 {
					b = append(b, frame(frameRSTStream, 0, id, 4)...)
				}
			}
			return append(b, frame(frameSettings, flagAck, 0, 0)...)
		}, true, ""},
		{"rapid reset", func() []byte {
			b := append(append([]byte{}, preface...), settings...)
			for i := range 600 {
				b = append(b, frame(frameHeaders, flagEndHeaders, uint32(2*i+1), 40)...)
				b = append(b, frame(frameRSTStream, 0, uint32(2*i+1), 4)...)
			}
			return b
		}, true, "too many streams reset or refused"},
		{"bad HEADERS: streams refused before the tap", func() []byte {
			b := append(append([]byte{}, preface...), settings...)
			for i := range 600 {
				b = append(b, frame(frameHeaders, flagEndHeaders|1, uint32(2*i+1), 10)...)
			}
			return b
		}, false, "too many streams reset or refused"},
		{"SETTINGS flood", func() []byte {
			b := append([]byte{}, preface...)
			for range 20 {
				b = append(b, settings...)
			}
			return b
		}, true, "too many SETTINGS frames"},
		{"empty CONTINUATION flood", func() []byte {
			b := append(append([]byte{}, preface...), settings...)
			b = append(b, frame(frameHeaders, 0, 1, 20)...)
			for range 20 {
				b = append(b, frame(frameContinuation, 0, 1, 0)...)
			}
			return b
		}, true, "header block of too many CONTINUATION frames or bytes"},
		{"a header block of 16 CONTINUATION frames is fine", func() []byte {
			b := append(append([]byte{}, preface...), settings...)
			for s := range 10 {
				b = append(b, frame(frameHeaders, 0, uint32(2*s+1), 100)...)
				for i := range 16 {
					flags := byte(0)
					if i == 15 {
						flags = flagEndHeaders
					}
					b = append(b, frame(frameContinuation, flags, uint32(2*s+1), 100)...)
				}
			}
			return b
		}, true, ""},
	}
	for _, tc := range tests {
		for _, piece := range []int{1, 7, 9, 100, 1 << 20} {
			addr := &connAddr{Addr: &net.TCPAddr{}}
			g := newFrameGuard(nil, addr, nil)
			b := tc.build()
			got := ""
			for len(b) > 0 && got == "" {
				k := min(piece, len(b))
				g.countRefused() // as at each Read
				got = g.scan(b[:k])
				if tc.tap {
					addr.tapped.Store(g.blocks) // grpc-go handled every block read
				}
				b = b[k:]
			}
			if got == "" {
				g.countRefused()
				got = g.scan(nil)
			}
			if got != tc.want {
				t.Errorf("%s, read %d bytes at a time: %q, want %q", tc.name, piece, got, tc.want)
			}
		}
	}
}

// TestFrameGuardGoAway: the guard's GOAWAY goes out between grpc-go's
// frames, never inside one.
func TestFrameGuardGoAway(t *testing.T) {
	for _, tc := range []struct {
		name    string
		written []byte
		goAway  bool
	}{
		{"after whole frames", append(frame(frameSettings, 0, 0, 6), frame(frameData, 0, 1, 100)...), true},
		{"inside a frame", frame(frameData, 0, 1, 100)[:50], false},
	} {
		server, client := net.Pipe()
		g := newFrameGuard(server, nil, nil)
		got := make(chan []byte)
		go func() {
			var all []byte
			buf := make([]byte, 4096)
			for {
				n, err := client.Read(buf)
				all = append(all, buf[:n]...)
				if err != nil {
					got <- all
					return
				}
			}
		}()
		if _, err := g.Write(tc.written); err != nil {
			t.Fatal(err)
		}
		g.calm("test")
		all := <-got
		rest := all[len(tc.written):]
		if sent := len(rest) > 0; sent != tc.goAway {
			t.Errorf("%s: GOAWAY sent %v, want %v", tc.name, sent, tc.goAway)
		}
		if tc.goAway && (rest[3] != frameGoAway || binary.BigEndian.Uint32(rest[13:]) != errCodeEnhanceYourCalm || !strings.HasSuffix(string(rest), "test")) {
			t.Errorf("%s: sent %x, want GOAWAY ENHANCE_YOUR_CALM", tc.name, rest)
		}
		if _, err := g.Read(make([]byte, 10)); err != errCalm {
			t.Errorf("%s: Read after calm: %v", tc.name, err)
		}
	}
}

// TestFrameCursor: whatever pieces the stream arrives in, the cursor finds
// every frame header, in order, with its payload length.
func TestFrameCursor(t *testing.T) {
	var stream []byte
	want := []struct {
		typ byte
		len int
	}{{4, 0}, {1, 5}, {0, 70000}, {8, 4}, {9, 1}}
	for _, w := range want {
		stream = append(stream, frame(w.typ, 0, 1, w.len)...)
	}
	for _, piece := range []int{1, 2, 8, 9, 10, 17, 4096, len(stream)} {
		var c frameCursor
		i := 0
		for p := stream; len(p) > 0; {
			var chunk []byte
			chunk, p = p[:min(piece, len(p))], p[min(piece, len(p)):]
			for {
				var ok bool
				if chunk, ok = c.next(chunk); !ok {
					break
				}
				if i >= len(want) || c.hdr[3] != want[i].typ || c.left != want[i].len {
					t.Fatalf("pieces of %d: header %d is type %d, length %d; want %+v", piece, i, c.hdr[3], c.left, want)
				}
				i++
			}
		}
		if i != len(want) || !c.atBoundary() {
			t.Errorf("pieces of %d: %d headers found, at a boundary: %v; want %d, true", piece, i, c.atBoundary(), len(want))
		}
	}
}

// TestFrameGuardPings: a PING flood ends the connection; pings that the
// server's HEADERS or DATA separate (flow-control pings), PING ACKs, and
// keepalives spread over time do not.
func TestFrameGuardPings(t *testing.T) {
	preface := []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
	pings := func(n int, flags byte) []byte {
		var b []byte
		for range n {
			b = append(b, frame(framePing, flags, 0, 8)...)
		}
		return b
	}
	for _, tc := range []struct {
		name     string
		rounds   int // rounds of 16 pings
		flags    byte
		answered bool // the server writes DATA after each round
		pause    bool // a window passes after each round
		want     string
	}{
		{"flood", 3, 0, false, false, "too many PING frames"},
		{"32 pings are fine", 2, 0, false, false, ""},
		{"pings that DATA separates", 50, 0, true, false, ""},
		{"PING ACKs", 50, flagAck, false, false, ""},
		{"keepalives over time", 50, 0, false, true, ""},
	} {
		server, client := net.Pipe()
		go io.Copy(io.Discard, client)
		g := newFrameGuard(server, nil, nil)
		got := g.scan(preface)
		for range tc.rounds {
			if got != "" {
				break
			}
			got = g.scan(pings(16, tc.flags))
			if tc.answered {
				g.Write(frame(frameData, 0, 1, 10))
			}
			if tc.pause {
				g.pingsFrom = g.pingsFrom.Add(-connbounds.PingWindow)
			}
		}
		if got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
		server.Close()
	}
}
