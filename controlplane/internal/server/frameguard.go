package server

import (
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/credentials"

	"github.com/sluicehq/sluice/controlplane/internal/connbounds"
)

// What one connection of a grpc-go server may send before the frame guard
// (frameGuard) tells it GOAWAY ENHANCE_YOUR_CALM and closes it: connbounds'
// thresholds, which package grpcunary applies too. grpc-go bounds the rest
// itself (header sizes: MaxHeaderListSize; streams: MaxConcurrentStreams),
// but answers each of these frames and never closes the connection, or
// (PING floods: its keepalive enforcement) only after it has answered a
// flood it reads faster than it can write. A connection that opens no
// stream stays in its first window (connbounds.ResetWindow).
var guardMaxBlock = connbounds.Default.MaxHeaderBlock()

// HTTP/2 frame types and flags the guard reads (RFC 9113, 6).
const (
	frameData         = 0x0
	frameHeaders      = 0x1
	frameRSTStream    = 0x3
	frameSettings     = 0x4
	framePing         = 0x6
	frameGoAway       = 0x7
	frameContinuation = 0x9

	flagAck        = 0x1
	flagEndHeaders = 0x4

	errCodeEnhanceYourCalm = 0xb
)

// clientPrefaceLen is the length of the HTTP/2 client preface.
const clientPrefaceLen = 24

// frameGuard is a server connection of a grpc-go server that reads the
// frame headers of what the client sends and ends the connection (GOAWAY
// ENHANCE_YOUR_CALM, then close) when the client floods frames that grpc-go
// answers one by one without ever closing:
//   - rapid reset (CVE-2023-44487) and bad HEADERS: past half of a window
//     of 1024 streams opened, streams the client reset (RST_STREAM) or that
//     grpc-go refused before they reached its tap handle (malformed or
//     forbidden headers, a stream over MAX_CONCURRENT_STREAMS). A stream
//     refused by the tap (the stream budget, credentials) is not counted:
//     the client had no way to know. An Envoy whose calls time out more
//     than half the time resets as many, loses its connection and opens
//     another, as with Envoy's and Go's own servers;
//   - SETTINGS: more than 16 in a window (a client sends one, at the
//     start);
//   - header blocks of more than 16 CONTINUATION frames or 32 KiB (the
//     CONTINUATION flood, empty frames included);
//   - PING: more than 32 within a second with no HEADERS or DATA from the
//     server in between (a flood, which grpc-go answers frame by frame
//     and keepalive enforcement only ends once it has written the answers
//     queued before its GOAWAY).
//
// Writes are serialized and their frame boundaries tracked, so that the
// GOAWAY goes out between two of grpc-go's frames (or not at all, the
// connection closing anyway, when it would land inside one).
type frameGuard struct {
	net.Conn
	addr  *connAddr          // the connection's counters; nil: no tap count
	calms prometheus.Counter // nil: not counted

	// Read side, used only by grpc-go's reader goroutine.
	preface   int         // bytes of the client preface still to pass
	in        frameCursor // the client's frames
	inBlock   bool        // a header block is open (no END_HEADERS yet)
	newStream bool        // the open block opens a stream
	conts     int         // CONTINUATION frames of the open block
	blockLen  int         // bytes of the open block
	maxStream uint32      // the highest stream id a header block opened
	opened    int         // streams opened in the window
	bad       int         // streams reset or refused in the window
	settings  int         // SETTINGS frames in the window
	blocks    uint64      // header blocks that opened streams, ever
	checked   uint64      // blocks compared with addr.tapped so far
	tapped    uint64      // addr.tapped at the last comparison
	pingsFrom time.Time   // when the pings counted began
	pings     int         // pings since pingsFrom, or since the server wrote HEADERS or DATA

	// answered is set by Write when the server writes HEADERS or DATA:
	// the pings counted start again.
	answered atomic.Bool

	// Write side.
	wmu    sync.Mutex
	out    frameCursor // grpc-go's frames, under wmu
	calmed atomic.Bool
}

// newFrameGuard guards c, whose counters are addr (nil: none).
func newFrameGuard(c net.Conn, addr *connAddr, calms prometheus.Counter) *frameGuard {
	return &frameGuard{Conn: c, addr: addr, calms: calms, preface: clientPrefaceLen}
}

// errCalm is returned by the reads of a connection the guard ended.
var errCalm = errors.New("sluice: connection closed: too many resets, refused streams, SETTINGS, CONTINUATION or PING frames (GOAWAY ENHANCE_YOUR_CALM)")

// Read reads from the connection and counts the frames read.
func (g *frameGuard) Read(b []byte) (int, error) {
	if g.calmed.Load() {
		return 0, errCalm
	}
	// grpc-go reads again only once it has handled every frame it had
	// whole (the tap handle runs as a stream's headers are handled), so
	// the blocks read before this call have all reached the tap or been
	// refused before it.
	g.countRefused()
	n, err := g.Conn.Read(b)
	if n > 0 {
		if reason := g.scan(b[:n]); reason != "" {
			g.calm(reason)
			return 0, errCalm
		}
	}
	return n, err
}

// countRefused counts as bad the header blocks read that did not reach the
// tap handle.
func (g *frameGuard) countRefused() {
	if g.addr == nil || g.blocks == g.checked {
		return
	}
	t := g.addr.tapped.Load()
	if refused := int(g.blocks-g.checked) - int(t-g.tapped); refused > 0 {
		g.bad += refused
	}
	g.checked, g.tapped = g.blocks, t
}

// scan reads the frame headers in p, the next bytes from the client, and
// returns why the connection must end, or "".
func (g *frameGuard) scan(p []byte) string {
	if g.preface > 0 {
		k := min(g.preface, len(p))
		g.preface -= k
		p = p[k:]
	}
	for {
		var ok bool
		if p, ok = g.in.next(p); !ok {
			break
		}
		h := &g.in.hdr
		if reason := g.frame(h[3], h[4], binary.BigEndian.Uint32(h[5:9])&(1<<31-1), g.in.left); reason != "" {
			return reason
		}
	}
	if g.bad > connbounds.MaxEarlyResets {
		return "too many streams reset or refused"
	}
	return ""
}

// frame counts one frame by its header.
func (g *frameGuard) frame(typ, flags byte, stream uint32, length int) string {
	switch typ {
	case frameHeaders:
		g.inBlock, g.conts, g.blockLen = true, 0, length
		g.newStream = stream > g.maxStream
		if g.newStream {
			g.maxStream = stream
		}
	case frameContinuation:
		if !g.inBlock {
			return "" // grpc-go ends the connection: a protocol error
		}
		g.conts++
		g.blockLen += length
		if g.conts > connbounds.MaxContinuations || g.blockLen > guardMaxBlock {
			return "header block of too many CONTINUATION frames or bytes"
		}
	case frameRSTStream:
		g.bad++
	case frameSettings:
		if flags&flagAck == 0 {
			g.settings++
			if g.settings > connbounds.MaxSettings {
				return "too many SETTINGS frames"
			}
		}
	case framePing:
		if flags&flagAck == 0 {
			return g.ping()
		}
	}
	if (typ == frameHeaders || typ == frameContinuation) && flags&flagEndHeaders != 0 {
		g.inBlock = false
		if g.newStream {
			g.blocks++
			g.opened++
			if g.opened >= connbounds.ResetWindow {
				if g.bad > connbounds.MaxEarlyResets {
					return "too many streams reset or refused"
				}
				g.opened, g.bad, g.settings = 0, 0, 0
			}
		}
	}
	return ""
}

// ping counts a PING from the client.
func (g *frameGuard) ping() string {
	now := time.Now()
	if g.answered.Swap(false) || now.Sub(g.pingsFrom) >= connbounds.PingWindow {
		g.pingsFrom, g.pings = now, 0
	}
	g.pings++
	if g.pings > connbounds.MaxPings {
		return "too many PING frames"
	}
	return ""
}

// calm sends GOAWAY ENHANCE_YOUR_CALM, if it can go out between two
// frames, and closes the connection.
func (g *frameGuard) calm(reason string) {
	if g.calmed.Swap(true) {
		return
	}
	if g.calms != nil {
		g.calms.Inc()
	}
	// A writer blocked on a client that does not read holds the lock:
	// then the connection closes without GOAWAY (which would not be read).
	if g.wmu.TryLock() {
		if g.out.atBoundary() {
			f := make([]byte, 9+8+len(reason))
			f[2] = byte(8 + len(reason))
			f[3] = frameGoAway
			binary.BigEndian.PutUint32(f[9:], g.maxStream)
			binary.BigEndian.PutUint32(f[13:], errCodeEnhanceYourCalm)
			copy(f[17:], reason)
			g.Conn.SetWriteDeadline(time.Now().Add(time.Second))
			g.Conn.Write(f)
		}
		g.wmu.Unlock()
	}
	g.Conn.Close()
}

// Write writes grpc-go's frames, keeping track of their boundaries.
func (g *frameGuard) Write(b []byte) (int, error) {
	g.wmu.Lock()
	defer g.wmu.Unlock()
	if g.calmed.Load() {
		return 0, net.ErrClosed
	}
	n, err := g.Conn.Write(b)
	for p := b[:n]; len(p) > 0; {
		var ok bool
		if p, ok = g.out.next(p); ok && (g.out.hdr[3] == frameHeaders || g.out.hdr[3] == frameData) {
			g.answered.Store(true)
		}
	}
	return n, err
}

// frameCursor follows the frame boundaries of an HTTP/2 byte stream that
// arrives in pieces (after the client preface).
type frameCursor struct {
	hdr  [9]byte // the frame header being read, or the last one read
	n    int     // bytes of hdr read
	left int     // payload bytes of the current frame still to pass
}

// next passes p up to the end of the next complete frame header, and
// returns the rest of p and whether it reached one: then hdr holds it and
// left is its payload length.
func (c *frameCursor) next(p []byte) ([]byte, bool) {
	for len(p) > 0 {
		if c.left > 0 {
			k := min(c.left, len(p))
			c.left -= k
			p = p[k:]
			continue
		}
		k := copy(c.hdr[c.n:], p)
		c.n += k
		p = p[k:]
		if c.n == len(c.hdr) {
			c.n = 0
			c.left = int(c.hdr[0])<<16 | int(c.hdr[1])<<8 | int(c.hdr[2])
			return p, true
		}
	}
	return p, false
}

// atBoundary reports whether the stream is between two frames.
func (c *frameCursor) atBoundary() bool { return c.left == 0 && c.n == 0 }

// guardCreds wraps a grpc-go server's transport credentials (TLS, or
// insecure for cleartext) so that each connection is read through a
// frameGuard once its handshake is done: above TLS, where the frames are.
type guardCreds struct {
	credentials.TransportCredentials
	calms prometheus.Counter
}

// ServerHandshake runs the wrapped handshake and guards the connection.
func (g guardCreds) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	sc, info, err := g.TransportCredentials.ServerHandshake(c)
	if err != nil {
		return nil, nil, err
	}
	ca, _ := c.RemoteAddr().(*connAddr)
	return newFrameGuard(sc, ca, g.calms), info, nil
}

// Clone clones the wrapped credentials.
func (g guardCreds) Clone() credentials.TransportCredentials {
	return guardCreds{g.TransportCredentials.Clone(), g.calms}
}
