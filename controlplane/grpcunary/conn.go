package grpcunary

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
)

const (
	clientPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

	defaultWindow    = 65535 // every window's size before SETTINGS and WINDOW_UPDATE say otherwise
	maxWindow        = 1<<31 - 1
	recvStreamWindow = 1 << 20  // our SETTINGS_INITIAL_WINDOW_SIZE
	recvConnWindow   = 16 << 20 // our connection receive window, after the first WINDOW_UPDATE
	defaultFrameSize = 16384    // SETTINGS_MAX_FRAME_SIZE until the peer says otherwise (ours stays so)

	writeBufferSize = 32 << 10
	readBufferSize  = 32 << 10
	closeGrace      = time.Second // how long a fatal GOAWAY may take to leave before the connection is cut
)

// conn is one HTTP/2 connection. The reader goroutine (serve) owns the
// Framer and the receive side; the writer goroutine (writeLoop) owns the
// socket's write side; mu guards what both touch.
type conn struct {
	srv    *Server
	nc     net.Conn
	fr     *http2.Framer
	ctx    context.Context // ends with the connection; parent of every call's context
	cancel context.CancelFunc

	// The reader's own state.
	sawSettings bool
	recvConn    int64 // what the peer may still send on the connection

	wake        chan struct{} // capacity 1: there is something to write
	writerDone  chan struct{}
	closeOnce   sync.Once
	closeReason atomic.Value // error, for the debug log

	// The writer's own state.
	enc   encoder // HPACK state of the blocks we send
	block []byte  // the header block being written

	mu          sync.Mutex
	streams     map[uint32]*stream // open streams: received, not yet fully answered
	maxStreamID uint32             // the highest stream the client opened
	ctrl        []byte             // control frames to write, in order
	ready       []*stream          // answers to write, in order
	sendConn    int64              // what we may still send on the connection
	peerInitial int64              // the peer's SETTINGS_INITIAL_WINDOW_SIZE
	peerFrame   uint32             // the peer's SETTINGS_MAX_FRAME_SIZE
	peerTable   uint32             // the peer's SETTINGS_HEADER_TABLE_SIZE...
	tableSet    bool               // ...newly set: the writer's HPACK state must follow
	draining    bool               // GOAWAY sent: no new streams, close when the last is answered
	goAwayID    uint32             // the last stream a draining connection answers
	fatal       bool               // a connection error: close once the GOAWAY is written
	closed      bool
}

// stream is one call.
type stream struct {
	id      uint32
	handler Handler
	ctx     context.Context
	cancel  context.CancelFunc

	// The reader's, until the call is dispatched.
	body          []byte
	recvAvail     int64 // what the peer may still send on the stream
	recvUnacked   int64 // consumed, not yet returned by WINDOW_UPDATE
	contentLength int64 // -1: not given
	discard       bool  // answered early: ignore its data
	remoteDone    atomic.Bool

	// Guarded by conn.mu.
	sendWin int64
	reset   bool // reset by either side, or the connection ended: nothing more to write

	// The answer, set before the stream is queued, then the writer's.
	ok          bool   // the answer is msg with OK trailers; else trl alone
	msg         []byte // the length-prefixed response message
	trl         []byte // HPACK block of a trailers-only answer (literals only)
	headersSent bool
	sent        int // bytes of msg sent
}

func newConn(s *Server, nc net.Conn) *conn {
	c := &conn{
		srv: s, nc: nc, wake: make(chan struct{}, 1), writerDone: make(chan struct{}),
		streams: map[uint32]*stream{}, sendConn: defaultWindow, peerInitial: defaultWindow,
		peerFrame: defaultFrameSize, recvConn: recvConnWindow,
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	// Reads go through a buffer: the Framer reads a frame header and then
	// its payload, two reads a frame, which would be two system calls.
	c.fr = http2.NewFramer(nil, bufio.NewReaderSize(nc, readBufferSize)) // writes are ours (writeLoop)
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.fr.MaxHeaderListSize = s.opts.MaxHeaderListSize
	return c
}

// serve runs the connection: it starts the writer, reads frames until the
// connection ends, and cleans up.
func (c *conn) serve() {
	defer c.srv.forget(c)
	go c.writeLoop()
	err := c.readLoop()
	c.mu.Lock()
	fatal := c.fatal
	c.mu.Unlock()
	if fatal {
		// Let the GOAWAY leave, unless the peer does not read.
		select {
		case <-c.writerDone:
		case <-time.After(closeGrace):
		}
	}
	c.closeWith(err)
	<-c.writerDone
	if r, ok := c.closeReason.Load().(error); ok && !errors.Is(r, io.EOF) && !errors.Is(r, net.ErrClosed) {
		c.srv.opts.Logger.Debug("grpcunary: connection ended", "remote", c.nc.RemoteAddr().String(), "error", r.Error())
	}
}

// readLoop reads the preface and then frames until the connection ends or
// is in error; it returns why it stopped.
func (c *conn) readLoop() error {
	// Our SETTINGS and the connection window go first; they need not wait
	// for the client's preface.
	c.mu.Lock()
	c.ctrl = appendSettings(c.ctrl, []http2.Setting{
		{ID: http2.SettingMaxConcurrentStreams, Val: c.srv.opts.MaxConcurrentStreams},
		{ID: http2.SettingInitialWindowSize, Val: recvStreamWindow},
		{ID: http2.SettingMaxHeaderListSize, Val: c.srv.opts.MaxHeaderListSize},
	})
	c.ctrl = appendWindowUpdate(c.ctrl, 0, recvConnWindow-defaultWindow)
	c.mu.Unlock()
	c.signal()

	c.nc.SetReadDeadline(time.Now().Add(c.srv.opts.HandshakeTimeout))
	var preface [len(clientPreface)]byte
	if _, err := io.ReadFull(c.nc, preface[:]); err != nil {
		return err
	}
	if string(preface[:]) != clientPreface {
		return errors.New("grpcunary: not an HTTP/2 client preface")
	}
	c.nc.SetReadDeadline(time.Time{})

	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			var se http2.StreamError
			var ce http2.ConnectionError
			switch {
			case errors.As(err, &se):
				c.resetStream(se.StreamID, se.Code)
				continue
			case errors.As(err, &ce):
				return c.goAway(http2.ErrCode(ce), err)
			case errors.Is(err, http2.ErrFrameTooLarge):
				return c.goAway(http2.ErrCodeFrameSize, err)
			}
			return err
		}
		if !c.sawSettings {
			if _, ok := f.(*http2.SettingsFrame); !ok {
				return c.goAway(http2.ErrCodeProtocol, errors.New("grpcunary: the first frame is not SETTINGS"))
			}
			c.sawSettings = true
		}
		if err := c.handleFrame(f); err != nil {
			var ce http2.ConnectionError
			if errors.As(err, &ce) {
				return c.goAway(http2.ErrCode(ce), err)
			}
			return err
		}
	}
}

// handleFrame acts on one frame. It returns a ConnectionError for a
// connection error; stream errors it handles itself.
func (c *conn) handleFrame(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.MetaHeadersFrame:
		return c.onHeaders(f)
	case *http2.DataFrame:
		return c.onData(f)
	case *http2.SettingsFrame:
		return c.onSettings(f)
	case *http2.WindowUpdateFrame:
		return c.onWindowUpdate(f)
	case *http2.RSTStreamFrame:
		return c.onReset(f)
	case *http2.PingFrame:
		if !f.IsAck() {
			c.mu.Lock()
			c.ctrl = appendPing(c.ctrl, f.Data)
			c.mu.Unlock()
			c.signal()
		}
	case *http2.PushPromiseFrame:
		return http2.ConnectionError(http2.ErrCodeProtocol) // clients never push
	case *http2.GoAwayFrame:
		// The client opens no more streams; the open ones are answered.
	}
	// PRIORITY and unknown frame types are ignored (RFC 9113, 5.5 and 5.3.2).
	return nil
}

// onHeaders opens a stream: it checks the request and either dispatches it
// (a request without body cannot be a unary call, so that is an error
// answer too) or waits for its DATA.
func (c *conn) onHeaders(f *http2.MetaHeadersFrame) error {
	id := f.StreamID
	if id%2 == 0 {
		return http2.ConnectionError(http2.ErrCodeProtocol)
	}
	c.mu.Lock()
	if st := c.streams[id]; st != nil {
		c.mu.Unlock()
		// Trailers from the client: gRPC sends none, but they end the request.
		if st.remoteDone.Load() {
			c.resetStream(id, http2.ErrCodeStreamClosed)
			return nil
		}
		if !f.StreamEnded() {
			c.resetStream(id, http2.ErrCodeProtocol)
			return nil
		}
		c.endRequest(st)
		return nil
	}
	if id <= c.maxStreamID {
		c.mu.Unlock()
		return http2.ConnectionError(http2.ErrCodeProtocol) // RFC 9113, 5.1.1
	}
	if c.draining {
		// After the GOAWAY: refused, and the client knows it was not processed.
		c.ctrl = appendRSTStream(c.ctrl, id, http2.ErrCodeRefusedStream)
		c.mu.Unlock()
		c.signal()
		return nil
	}
	c.maxStreamID = id
	if uint32(len(c.streams)) >= c.srv.opts.MaxConcurrentStreams {
		c.ctrl = appendRSTStream(c.ctrl, id, http2.ErrCodeRefusedStream)
		c.mu.Unlock()
		c.signal()
		return nil
	}
	st := &stream{id: id, sendWin: c.peerInitial, recvAvail: recvStreamWindow, contentLength: -1}
	c.streams[id] = st
	c.mu.Unlock()

	if f.Truncated {
		c.answerHTTP(st, 431)
		return nil
	}
	var method, path, scheme, contentType, timeout, encoding string
	for _, hf := range f.Fields {
		switch hf.Name {
		case ":method":
			method = hf.Value
		case ":path":
			path = hf.Value
		case ":scheme":
			scheme = hf.Value
		case ":authority":
		case "content-type":
			contentType = hf.Value
		case "grpc-timeout":
			timeout = hf.Value
		case "grpc-encoding":
			encoding = hf.Value
		case "content-length":
			n, err := strconv.ParseInt(hf.Value, 10, 64)
			if err != nil || n < 0 {
				c.resetStream(id, http2.ErrCodeProtocol)
				return nil
			}
			st.contentLength = n
		case "connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade":
			c.resetStream(id, http2.ErrCodeProtocol) // RFC 9113, 8.2.2
			return nil
		case "te":
			if hf.Value != "trailers" {
				c.resetStream(id, http2.ErrCodeProtocol)
				return nil
			}
		default:
			if strings.HasPrefix(hf.Name, ":") {
				c.resetStream(id, http2.ErrCodeProtocol) // a response pseudo-header in a request
				return nil
			}
		}
	}
	if method == "" || path == "" || scheme == "" {
		c.resetStream(id, http2.ErrCodeProtocol) // RFC 9113, 8.3.1
		return nil
	}
	switch {
	case method != "POST":
		c.answerHTTP(st, 405)
		return nil
	case !isGRPCContentType(contentType):
		c.answerHTTP(st, 415)
		return nil
	}
	h := c.srv.methods[path]
	if h == nil {
		c.answerStatus(st, codes.Unimplemented, "grpcunary: unknown method "+path)
		return nil
	}
	if encoding != "" && encoding != "identity" {
		c.answerStatus(st, codes.Unimplemented, "grpcunary: grpc-encoding "+encoding+" is not supported")
		return nil
	}
	st.handler = h
	if timeout != "" {
		d, ok := parseTimeout(timeout)
		if !ok {
			c.answerStatus(st, codes.Internal, "grpcunary: malformed grpc-timeout "+strconv.Quote(timeout))
			return nil
		}
		st.ctx, st.cancel = context.WithTimeout(c.ctx, d)
	} else {
		st.ctx, st.cancel = context.WithCancel(c.ctx)
	}
	if f.StreamEnded() {
		c.endRequest(st)
	}
	return nil
}

// isGRPCContentType reports whether ct is application/grpc, alone or with
// a subtype (application/grpc+proto) or parameters.
func isGRPCContentType(ct string) bool {
	const base = "application/grpc"
	if len(ct) < len(base) || !strings.EqualFold(ct[:len(base)], base) {
		return false
	}
	return len(ct) == len(base) || ct[len(base)] == '+' || ct[len(base)] == ';'
}

// onData takes a request's data, minding both receive windows.
func (c *conn) onData(f *http2.DataFrame) error {
	id, n := f.StreamID, int64(f.Length)
	c.recvConn -= n
	if c.recvConn < 0 {
		return http2.ConnectionError(http2.ErrCodeFlowControl)
	}
	// The connection window is returned as soon as data arrives: a stream's
	// data is bounded by MaxRecvMsgSize, and the stream windows pace it.
	if used := recvConnWindow - c.recvConn; used >= recvConnWindow/2 {
		c.recvConn += used
		c.mu.Lock()
		c.ctrl = appendWindowUpdate(c.ctrl, 0, uint32(used))
		c.mu.Unlock()
		c.signal()
	}
	c.mu.Lock()
	st := c.streams[id]
	idle := id > c.maxStreamID
	c.mu.Unlock()
	if st == nil {
		if idle {
			return http2.ConnectionError(http2.ErrCodeProtocol) // DATA on an idle stream
		}
		return nil // a stream that has ended: ignored (RFC 9113, 5.1)
	}
	if st.remoteDone.Load() {
		c.resetStream(id, http2.ErrCodeStreamClosed)
		return nil
	}
	st.recvAvail -= n
	if st.recvAvail < 0 {
		c.resetStream(id, http2.ErrCodeFlowControl)
		return nil
	}
	if !st.discard {
		st.body = append(st.body, f.Data()...)
		if len(st.body) > c.srv.opts.MaxRecvMsgSize+5 {
			st.body = nil
			c.answerStatus(st, codes.ResourceExhausted, "grpcunary: request larger than "+strconv.Itoa(c.srv.opts.MaxRecvMsgSize)+" bytes")
		}
	}
	if f.StreamEnded() {
		c.endRequest(st)
		return nil
	}
	st.recvUnacked += n
	if st.recvUnacked >= recvStreamWindow/2 {
		inc := st.recvUnacked
		st.recvAvail += inc
		st.recvUnacked = 0
		c.mu.Lock()
		c.ctrl = appendWindowUpdate(c.ctrl, id, uint32(inc))
		c.mu.Unlock()
		c.signal()
	}
	return nil
}

// endRequest handles the end of a request: the call is checked and run.
func (c *conn) endRequest(st *stream) {
	st.remoteDone.Store(true)
	if st.discard {
		return
	}
	body := st.body
	st.body = nil
	if st.contentLength >= 0 && st.contentLength != int64(len(body)) {
		c.resetStream(st.id, http2.ErrCodeProtocol) // RFC 9113, 8.1.1
		return
	}
	if len(body) < 5 {
		c.answerStatus(st, codes.Internal, "grpcunary: a unary call needs exactly one request message, got none")
		return
	}
	switch body[0] {
	case 0:
	case 1:
		c.answerStatus(st, codes.Unimplemented, "grpcunary: compressed messages are not supported")
		return
	default:
		c.answerStatus(st, codes.Internal, "grpcunary: invalid message flags "+strconv.Itoa(int(body[0])))
		return
	}
	if n := binary.BigEndian.Uint32(body[1:5]); int64(n) != int64(len(body)-5) {
		c.answerStatus(st, codes.Internal, "grpcunary: a unary call needs exactly one request message: prefix says "+
			strconv.FormatUint(uint64(n), 10)+" bytes, the stream has "+strconv.Itoa(len(body)-5))
		return
	}
	c.srv.dispatch(call{c, st, body[5:]})
}

// run calls the handler and queues its answer.
func (c *conn) run(st *stream, req []byte) {
	resp, err := st.handler(st.ctx, req)
	if err != nil {
		code, msg := statusOf(err)
		st.trl = appendTrailersOnly(nil, code, msg)
	} else {
		msg := make([]byte, 5+len(resp))
		binary.BigEndian.PutUint32(msg[1:5], uint32(len(resp)))
		copy(msg[5:], resp)
		st.ok, st.msg = true, msg
	}
	c.queue(st)
}

// answerStatus answers st with a gRPC error at once and ignores the rest of
// its request.
func (c *conn) answerStatus(st *stream, code codes.Code, msg string) {
	st.discard = true
	st.trl = appendTrailersOnly(nil, code, msg)
	c.queue(st)
}

// answerHTTP answers st with an HTTP status and no body at once (the
// request is not a gRPC call).
func (c *conn) answerHTTP(st *stream, status int) {
	st.discard = true
	st.trl = appendHTTPStatus(nil, status)
	c.queue(st)
}

// queue hands an answered stream to the writer.
func (c *conn) queue(st *stream) {
	c.mu.Lock()
	if st.reset || c.closed {
		c.mu.Unlock()
		return
	}
	c.ready = append(c.ready, st)
	c.mu.Unlock()
	c.signal()
}

// resetStream ends stream id with RST_STREAM code: its answer, if any, is
// dropped and its call's context cancelled.
func (c *conn) resetStream(id uint32, code http2.ErrCode) {
	c.mu.Lock()
	st := c.streams[id]
	if st != nil {
		st.reset = true
		delete(c.streams, id)
	}
	c.ctrl = appendRSTStream(c.ctrl, id, code)
	c.mu.Unlock()
	if st != nil {
		st.discard = true
		if st.cancel != nil {
			st.cancel()
		}
	}
	c.signal()
	c.closeIfDrained()
}

// onReset takes the client's RST_STREAM: the call is cancelled.
func (c *conn) onReset(f *http2.RSTStreamFrame) error {
	c.mu.Lock()
	if f.StreamID > c.maxStreamID {
		c.mu.Unlock()
		return http2.ConnectionError(http2.ErrCodeProtocol) // RST_STREAM on an idle stream
	}
	st := c.streams[f.StreamID]
	if st != nil {
		st.reset = true
		delete(c.streams, f.StreamID)
	}
	c.mu.Unlock()
	if st != nil {
		st.discard = true
		if st.cancel != nil {
			st.cancel()
		}
		c.closeIfDrained()
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
	if f.StreamID > c.maxStreamID {
		c.mu.Unlock()
		return http2.ConnectionError(http2.ErrCodeProtocol) // WINDOW_UPDATE on an idle stream
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

// goAway sends GOAWAY code, after which the connection closes; it returns
// err, the reason.
func (c *conn) goAway(code http2.ErrCode, err error) error {
	c.mu.Lock()
	c.ctrl = appendGoAway(c.ctrl, c.maxStreamID, code)
	c.fatal = true
	c.mu.Unlock()
	c.signal()
	return err
}

// drain starts a graceful stop: GOAWAY naming the last stream answered, and
// the connection closes once those are answered.
func (c *conn) drain() {
	c.mu.Lock()
	if c.closed || c.draining {
		c.mu.Unlock()
		return
	}
	c.draining = true
	c.goAwayID = c.maxStreamID
	c.ctrl = appendGoAway(c.ctrl, c.goAwayID, http2.ErrCodeNo)
	c.mu.Unlock()
	c.signal()
	c.closeIfDrained()
}

// closeIfDrained tells the writer to close a draining connection that has
// no open stream left (after writing what is queued).
func (c *conn) closeIfDrained() {
	c.mu.Lock()
	if c.draining && len(c.streams) == 0 {
		c.fatal = true // (not an error: "close after the write")
		c.signalLocked()
	}
	c.mu.Unlock()
}

// closeWith closes the connection at once, cancelling its calls.
func (c *conn) closeWith(reason error) {
	c.closeOnce.Do(func() {
		if reason != nil {
			c.closeReason.Store(reason)
		}
		c.mu.Lock()
		c.closed = true
		for id, st := range c.streams {
			st.reset = true
			delete(c.streams, id)
		}
		c.mu.Unlock()
		c.cancel()
		c.nc.Close()
		c.signal()
	})
}

// close is closeWith without a reason (Server.Stop).
func (c *conn) close() { c.closeWith(nil) }

// signal wakes the writer.
func (c *conn) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// signalLocked is signal for a caller holding mu (the channel send never
// blocks, so holding the lock is harmless).
func (c *conn) signalLocked() { c.signal() }
