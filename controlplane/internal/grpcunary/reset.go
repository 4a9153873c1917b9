package grpcunary

import (
	"golang.org/x/net/http2"
)

// idleLocked reports whether stream id is idle: the client never opened
// it (RFC 9113, 5.1; we open no streams, so even ones are all idle).
func (c *conn) idleLocked(id uint32) bool { return id%2 == 0 || id > c.maxStreamID }

// resetByUsLocked reports whether we reset stream id lately (RFC 9113,
// 5.1: frames the client sent before it learned of it are ignored).
func (c *conn) resetByUsLocked(id uint32) bool {
	for _, r := range c.resets {
		if r == id {
			return true
		}
	}
	return false
}

// resetLocked queues RST_STREAM code for stream id and remembers the reset.
func (c *conn) resetLocked(id uint32, code http2.ErrCode) {
	c.ctrl = appendRSTStream(c.ctrl, id, code)
	c.ctrlQueuedLocked()
	c.noteResetLocked(id)
}

// noteResetLocked remembers that we reset stream id.
func (c *conn) noteResetLocked(id uint32) {
	c.resets[c.resetNext] = id
	c.resetNext = (c.resetNext + 1) % len(c.resets)
}

// resetStream ends stream id with RST_STREAM code: its answer, if any, is
// dropped and its call's context cancelled.
func (c *conn) resetStream(id uint32, code http2.ErrCode) {
	c.mu.Lock()
	st := c.takeStreamLocked(id)
	c.resetLocked(id, code)
	c.mu.Unlock()
	c.cancelStream(st)
	c.signal()
	c.closeIfDrained()
}

// onReset takes the client's RST_STREAM: the call is cancelled.
func (c *conn) onReset(f *http2.RSTStreamFrame) error {
	c.mu.Lock()
	if c.idleLocked(f.StreamID) {
		c.mu.Unlock()
		return http2.ConnectionError(http2.ErrCodeProtocol) // RST_STREAM on an idle stream (RFC 9113, 5.1)
	}
	st := c.takeStreamLocked(f.StreamID)
	flood := st != nil && !st.dispatched && c.earlyResetLocked()
	c.mu.Unlock()
	if st != nil {
		c.cancelStream(st)
		c.closeIfDrained()
	}
	if flood {
		return c.goAway(http2.ErrCodeEnhanceYourCalm, errResetFlood)
	}
	return nil
}

// takeStreamLocked removes stream id from the open streams and marks it
// reset, so that its answer is dropped; it returns the stream, or nil if
// it was not open. c.mu is held.
func (c *conn) takeStreamLocked(id uint32) *stream {
	st := c.streams[id]
	if st != nil {
		st.reset = true
		delete(c.streams, id)
	}
	return st
}

// cancelStream ends the reader's interest in a stream taken by
// takeStreamLocked (nil: none), releases its request buffer if the reader
// still holds it, and cancels its call's context.
func (c *conn) cancelStream(st *stream) {
	if st == nil {
		return
	}
	st.discard = true
	c.drop(st)
	if st.ctx != nil {
		st.ctx.cancel()
	}
}
