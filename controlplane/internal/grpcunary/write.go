package grpcunary

import (
	"bufio"
	"encoding/binary"
	"runtime"
	"sync"
	"time"

	"golang.org/x/net/http2"
)

// writers are the write buffers of the connections' rounds: an idle
// connection holds none.
var writers = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, writeBufferSize) }}

// writeLoop writes what the connection queues: control frames first, then
// answers in the order they became ready, as far as the send windows allow,
// and flushes once per round. An answer the windows hold back waits for the
// next round (a WINDOW_UPDATE or SETTINGS wakes it).
func (c *conn) writeLoop() {
	defer close(c.writerDone)
	var (
		ctrl    []byte
		ready   []*stream
		waiting []*stream // answers held back by flow control, oldest first
	)
	for range c.wake {
		bw := writers.Get().(*bufio.Writer)
		bw.Reset(c.nc)
		for round := range 2 {
			if round == 1 {
				// Answers tend to come in bursts (a Redis pipeline answers
				// many calls at once): let the other callers that are ready
				// queue theirs, and write them with the same system call.
				runtime.Gosched()
			}
			var closed bool
			if ctrl, ready, closed = c.take(ctrl[:0], ready[:0]); closed {
				bw.Reset(nil)
				writers.Put(bw)
				return
			}
			bw.Write(ctrl)
			waiting = c.writeAnswers(bw, append(waiting, ready...))
		}
		clear(ready)
		err := bw.Flush()
		bw.Reset(nil)
		writers.Put(bw)

		c.mu.Lock()
		closeNow := c.fatal && len(c.ctrl) == 0 && (!c.draining || len(c.streams) == 0)
		c.mu.Unlock()
		if err != nil {
			c.closeWith(err)
			return
		}
		if closeNow {
			c.closeWrite()
			return
		}
	}
}

// closeWrite ends the connection's sending side once its last frame is
// written (a GOAWAY, or a draining connection's last answer) with a FIN,
// which the peer reads after those frames, and gives the peer closeGrace to
// close its side (the reader, or linger, reads until then); evictGrace for
// a connection closed to make room, whose slot the new one waits for.
func (c *conn) closeWrite() {
	cw, ok := c.nc.(interface{ CloseWrite() error })
	if !ok || cw.CloseWrite() != nil {
		c.closeWith(nil)
		return
	}
	grace := closeGrace
	if c.evicting.Load() {
		grace = evictGrace
	}
	c.nc.SetReadDeadline(time.Now().Add(grace))
}

// take appends the queued control frames and answers to ctrl and ready and
// empties the queues; closed reports a closed connection.
func (c *conn) take(ctrl []byte, ready []*stream) ([]byte, []*stream, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ctrl, ready, true
	}
	if c.tableSet {
		c.tableSet = false
		c.enc.setTableSize(c.peerTable)
	}
	ctrl = append(ctrl, c.ctrl...)
	ready = append(ready, c.ready...)
	c.ctrl = c.ctrl[:0]
	c.ctrlFrames = 0
	clear(c.ready)
	c.ready = c.ready[:0]
	return ctrl, ready, false
}

// writeAnswers writes the answers in sts, in order, and returns those the
// send windows hold back (sts, reused).
func (c *conn) writeAnswers(bw *bufio.Writer, sts []*stream) []*stream {
	n := 0
	for _, st := range sts {
		if !c.writeAnswer(bw, st) {
			sts[n] = st
			n++
		}
	}
	clear(sts[n:])
	return sts[:n]
}

// writeAnswer writes as much of st's answer as the send windows allow and
// reports whether the stream is done with (answered in full, or reset).
func (c *conn) writeAnswer(bw *bufio.Writer, st *stream) bool {
	if !st.ok { // trailers-only
		if !c.finish(st) {
			return true
		}
		c.block = append(c.enc.start(c.block[:0]), st.trl...)
		writeFrame(bw, http2.FrameHeaders, http2.FlagHeadersEndHeaders|http2.FlagHeadersEndStream, st.id, c.block)
		c.afterEnd(bw, st)
		return true
	}
	if !st.headersSent {
		c.mu.Lock()
		reset := st.reset
		c.mu.Unlock()
		if reset {
			return true
		}
		c.block = c.enc.headers(c.block[:0])
		writeFrame(bw, http2.FrameHeaders, http2.FlagHeadersEndHeaders, st.id, c.block)
		st.headersSent = true
	}
	for st.sent < len(st.msg) {
		c.mu.Lock()
		if st.reset {
			c.mu.Unlock()
			return true
		}
		n := int64(len(st.msg) - st.sent)
		n = min(n, c.sendConn, st.sendWin, int64(c.peerFrame))
		if n <= 0 {
			c.mu.Unlock()
			return false
		}
		c.sendConn -= n
		st.sendWin -= n
		c.mu.Unlock()
		writeFrame(bw, http2.FrameData, 0, st.id, st.msg[st.sent:st.sent+int(n)])
		st.sent += int(n)
	}
	if !c.finish(st) {
		return true
	}
	c.block = c.enc.trailers(c.block[:0])
	writeFrame(bw, http2.FrameHeaders, http2.FlagHeadersEndHeaders|http2.FlagHeadersEndStream, st.id, c.block)
	c.afterEnd(bw, st)
	return true
}

// finish removes st from the open streams before its last frame is
// written; it reports false if st was reset meanwhile (nothing to write).
func (c *conn) finish(st *stream) bool {
	c.mu.Lock()
	if st.reset {
		c.mu.Unlock()
		return false
	}
	st.reset = true // ended: a late WINDOW_UPDATE or RST_STREAM finds nothing
	delete(c.streams, st.id)
	if st.rstAfter = !st.remoteDone.Load(); st.rstAfter {
		c.noteResetLocked(st.id)
	}
	if c.draining && !c.drainPing && len(c.streams) == 0 {
		c.fatal = true // close after this round's flush
	}
	c.mu.Unlock()
	return true
}

// afterEnd follows an answer's last frame: a client still sending is told
// to stop (RST_STREAM NO_ERROR, RFC 9113 8.1), and the call's context is
// released.
func (c *conn) afterEnd(bw *bufio.Writer, st *stream) {
	if st.rstAfter {
		bw.Write(appendRSTStream(bw.AvailableBuffer(), st.id, http2.ErrCodeNo))
	}
	if st.ctx != nil {
		st.ctx.cancel()
	}
}

// writeFrame writes one frame. The header goes through bw.AvailableBuffer:
// an array of our own passed to bw.Write escapes (bufio may hand it to the
// socket), one allocation a frame.
func writeFrame(bw *bufio.Writer, t http2.FrameType, flags http2.Flags, id uint32, payload []byte) {
	bw.Write(appendFrameHeader(bw.AvailableBuffer(), len(payload), t, flags, id))
	bw.Write(payload)
}

func putFrameHeader(h []byte, length int, t http2.FrameType, flags http2.Flags, id uint32) {
	h[0], h[1], h[2] = byte(length>>16), byte(length>>8), byte(length)
	h[3], h[4] = byte(t), byte(flags)
	binary.BigEndian.PutUint32(h[5:], id&(1<<31-1))
}

func appendFrameHeader(b []byte, length int, t http2.FrameType, flags http2.Flags, id uint32) []byte {
	var h [9]byte
	putFrameHeader(h[:], length, t, flags, id)
	return append(b, h[:]...)
}

func appendSettings(b []byte, settings []http2.Setting) []byte {
	b = appendFrameHeader(b, 6*len(settings), http2.FrameSettings, 0, 0)
	for _, s := range settings {
		b = binary.BigEndian.AppendUint16(b, uint16(s.ID))
		b = binary.BigEndian.AppendUint32(b, s.Val)
	}
	return b
}

func appendSettingsAck(b []byte) []byte {
	return appendFrameHeader(b, 0, http2.FrameSettings, http2.FlagSettingsAck, 0)
}

func appendPing(b []byte, data [8]byte) []byte {
	b = appendFrameHeader(b, 8, http2.FramePing, http2.FlagPingAck, 0)
	return append(b, data[:]...)
}

func appendWindowUpdate(b []byte, id, inc uint32) []byte {
	b = appendFrameHeader(b, 4, http2.FrameWindowUpdate, 0, id)
	return binary.BigEndian.AppendUint32(b, inc)
}

func appendRSTStream(b []byte, id uint32, code http2.ErrCode) []byte {
	b = appendFrameHeader(b, 4, http2.FrameRSTStream, 0, id)
	return binary.BigEndian.AppendUint32(b, uint32(code))
}

func appendGoAway(b []byte, lastID uint32, code http2.ErrCode) []byte {
	b = appendFrameHeader(b, 8, http2.FrameGoAway, 0, 0)
	b = binary.BigEndian.AppendUint32(b, lastID)
	return binary.BigEndian.AppendUint32(b, uint32(code))
}
