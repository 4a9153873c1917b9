package grpcunary

import (
	"golang.org/x/net/http2"
)

// takeConnWindow accounts n bytes of DATA, on any stream, against the
// connection's receive window. The window is returned as soon as half of it
// is used: a stream's data is bounded by MaxMsgBytes, and the stream
// windows pace it.
func (c *conn) takeConnWindow(n int64) error {
	c.recvConn -= n
	if c.recvConn < 0 {
		return http2.ConnectionError(http2.ErrCodeFlowControl)
	}
	if used := recvConnWindow - c.recvConn; used >= recvConnWindow/2 {
		c.recvConn += used
		c.mu.Lock()
		c.ctrl = appendWindowUpdate(c.ctrl, 0, uint32(used))
		c.ctrlQueuedLocked()
		c.mu.Unlock()
		c.signal()
	}
	return nil
}

// onSettings applies the client's settings and acknowledges them.
func (c *conn) onSettings(f *http2.SettingsFrame) error {
	if f.IsAck() {
		return nil
	}
	if err := f.ForeachSetting(func(s http2.Setting) error { return s.Valid() }); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	err := f.ForeachSetting(func(s http2.Setting) error {
		switch s.ID {
		case http2.SettingInitialWindowSize:
			delta := int64(s.Val) - c.peerInitial
			for _, st := range c.streams {
				st.sendWin += delta
				if st.sendWin > maxWindow {
					return http2.ConnectionError(http2.ErrCodeFlowControl) // RFC 9113, 6.9.2
				}
			}
			c.peerInitial = int64(s.Val)
		case http2.SettingMaxFrameSize:
			c.peerFrame = s.Val
		case http2.SettingHeaderTableSize:
			c.peerTable, c.tableSet = s.Val, true
		}
		// The others do not concern a server.
		return nil
	})
	if err != nil {
		return err
	}
	c.ctrl = appendSettingsAck(c.ctrl)
	c.ctrlQueuedLocked()
	c.signalLocked()
	return nil
}

// onWindowUpdate grows a send window.
func (c *conn) onWindowUpdate(f *http2.WindowUpdateFrame) error {
	inc := int64(f.Increment)
	c.mu.Lock()
	if f.StreamID == 0 {
		c.sendConn += inc
		over := c.sendConn > maxWindow
		c.mu.Unlock()
		if over {
			return http2.ConnectionError(http2.ErrCodeFlowControl)
		}
		c.signal()
		return nil
	}
	if c.idleLocked(f.StreamID) {
		c.mu.Unlock()
		return http2.ConnectionError(http2.ErrCodeProtocol) // WINDOW_UPDATE on an idle stream (RFC 9113, 5.1)
	}
	st := c.streams[f.StreamID]
	over := false
	if st != nil {
		st.sendWin += inc
		over = st.sendWin > maxWindow
	}
	c.mu.Unlock()
	if over {
		c.resetStream(f.StreamID, http2.ErrCodeFlowControl)
		return nil
	}
	c.signal()
	return nil
}
