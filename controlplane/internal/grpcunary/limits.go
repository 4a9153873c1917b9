package grpcunary

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"time"

	"golang.org/x/net/http2"

	"github.com/sluicehq/sluice/controlplane/internal/connbounds"
)

// refuseWriteTimeout bounds the GOAWAY written to a connection over
// MaxConns. The other bounds of what a connection may make the server queue
// or read are connbounds' (RATIONALE.md, "Bounds").
const refuseWriteTimeout = 100 * time.Millisecond

var (
	errCtrlFlood  = errors.New("grpcunary: the peer does not read its control frames")
	errResetFlood = errors.New("grpcunary: the peer resets most streams before their call starts (rapid reset)")
	errConnBudget = errors.New("the connection's request buffer is full")
	errSrvBudget  = errors.New("the server's request buffer is full")
)

// refuseConn turns away a connection over MaxConns: our SETTINGS, a GOAWAY
// ENHANCE_YOUR_CALM that says why, and the end. The write goes to a fresh
// socket's empty send buffer, so it does not wait.
func refuseConn(nc net.Conn) {
	const why = "grpcunary: too many connections"
	b := appendSettings(nil, nil)
	b = appendFrameHeader(b, 8+len(why), http2.FrameGoAway, 0, 0)
	b = binary.BigEndian.AppendUint32(b, 0)
	b = binary.BigEndian.AppendUint32(b, uint32(http2.ErrCodeEnhanceYourCalm))
	b = append(b, why...)
	nc.SetWriteDeadline(time.Now().Add(refuseWriteTimeout))
	nc.Write(b)
	nc.Close()
}

// ctrlQueuedLocked follows each control frame appended to c.ctrl: past the
// bounds the connection is to end (the reader checks c.calm). c.mu is held.
func (c *conn) ctrlQueuedLocked() {
	c.ctrlFrames++
	if c.ctrlFrames > connbounds.MaxQueuedCtrlFrames || len(c.ctrl) > connbounds.MaxQueuedCtrlBytes {
		c.calm.Store(true)
	}
}

// earlyResetLocked counts a client's reset of a stream whose call had not
// started; it reports whether the connection is past
// connbounds.MaxEarlyResets in its window (rapid reset, CVE-2023-44487). c.mu is held.
func (c *conn) earlyResetLocked() bool {
	if c.opened-c.resetWindowStart >= connbounds.ResetWindow {
		c.resetWindowStart, c.earlyResets = c.opened, 0
	}
	c.earlyResets++
	return c.earlyResets > connbounds.MaxEarlyResets
}

// readHeaders reads a HEADERS frame with header fh, and its CONTINUATION
// frames if it has any: at most connbounds.MaxContinuations of them and
// MaxHeaderBlock bytes (an endless run of empty CONTINUATION frames is a
// flood). It decodes the block and returns the request's headers as a
// MetaHeadersFrame (valid until the next block).
func (c *conn) readHeaders(fh http2.FrameHeader) (http2.Frame, error) {
	f, err := c.fr.ReadFrameForHeader(fh)
	if err != nil {
		return nil, err
	}
	hf := f.(*http2.HeadersFrame)
	if hf.HeadersEnded() {
		return c.hdec.decode(hf, hf.HeaderBlockFragment())
	}
	// The block is decoded whole, as one frame's would be, so that a block
	// split over frames gets the same answers.
	block := bytes.Clone(hf.HeaderBlockFragment())
	limit := c.srv.opts.MaxHeaderBlock()
	for n := 0; ; n++ {
		if n == connbounds.MaxContinuations || len(block) > limit {
			return nil, http2.ConnectionError(http2.ErrCodeEnhanceYourCalm)
		}
		f, err := c.fr.ReadFrame() // a CONTINUATION of this stream, or a connection error
		if err != nil {
			return nil, err
		}
		cf := f.(*http2.ContinuationFrame)
		block = append(block, cf.HeaderBlockFragment()...)
		if cf.HeadersEnded() {
			break
		}
	}
	return c.hdec.decode(hf, block)
}

// sweeper runs sweep until the server stops.
func (s *Server) sweeper() {
	o := &s.opts
	shortest := min(o.HandshakeTimeout, o.IdleTimeout, o.FirstCallTimeout, o.BodyTimeout)
	t := time.NewTicker(min(max(shortest/4, 10*time.Millisecond), time.Second))
	defer t.Stop()
	for {
		select {
		case <-t.C:
			s.sweep(s.now())
		case <-s.quit:
			return
		}
	}
}

// sweep ends the connections that are past a deadline at now: the
// handshake's (HandshakeTimeout from the accept to the first SETTINGS),
// the first call's (FirstCallTimeout from the accept to the first answer),
// the idle one (IdleTimeout without a new stream), and the one by which a
// connection told to end must have ended; and it resets the requests
// whose body is late (BodyTimeout).
func (s *Server) sweep(now time.Time) {
	s.mu.Lock()
	cs := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		cs = append(cs, c)
	}
	s.mu.Unlock()
	for _, c := range cs {
		c.sweep(now)
	}
}

// sweep is Server.sweep for one connection. Its fields idleSince,
// lastOpened and endBy are the sweep's own.
func (c *conn) sweep(now time.Time) {
	o := &c.srv.opts
	c.expireBodies(now)
	c.mu.Lock()
	var end, kill bool
	switch {
	case !c.endBy.IsZero():
		kill = now.After(c.endBy)
	case !c.handshook && now.Sub(c.born) >= o.HandshakeTimeout:
		end = true
	case c.answered == 0 && now.Sub(c.born) >= o.FirstCallTimeout:
		end = true
	case c.opened != c.lastOpened:
		c.idleSince, c.lastOpened = now, c.opened // a stream opened since the last sweep
	default:
		// Streams still open now are requests that never end, or calls
		// that last minutes, which a decision never does: the kill after
		// endBy cuts them.
		end = now.Sub(c.idleSince) >= o.IdleTimeout
	}
	if end {
		// A peer that reads nothing keeps the GOAWAY from leaving: then
		// the connection is closed at the next sweep after endBy.
		c.endBy = now.Add(2 * closeGrace)
	}
	c.mu.Unlock()
	switch {
	case kill:
		c.close()
	case end:
		c.drain()
	}
}
