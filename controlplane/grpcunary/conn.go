package grpcunary

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
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
	closeGrace      = time.Second // how long a GOAWAY may take to leave, and the peer to hang up after it
	recentResets    = 128         // how many streams we reset are remembered (see conn.resets)
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
	br          *bufio.Reader
	pending     []*stream // complete calls of a batch method, not yet handed over...
	pendingM    *method   // ...and their method
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
	// The last streams we reset while the client may still have been
	// sending (a ring; 0 is no stream): frames that were in flight when
	// the RST_STREAM left are ignored on them, while frames on other
	// closed streams are errors (RFC 9113, 5.1).
	resets    [recentResets]uint32
	resetNext int
}

// stream is one call.
type stream struct {
	id     uint32
	method *method
	req    []byte // the request message, once the request is complete
	ctx    context.Context
	cancel context.CancelFunc

	// The reader's, until the call is dispatched.
	body          []byte
	recvAvail     int64 // what the peer may still send on the stream
	recvUnacked   int64 // consumed, not yet returned by WINDOW_UPDATE
	contentLength int64 // -1: not given
	received      int64 // bytes of DATA received (padding aside)
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
	sent        int  // bytes of msg sent
	rstAfter    bool // the request was not over when the answer ended: RST_STREAM NO_ERROR follows
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
	c.br = bufio.NewReaderSize(nc, readBufferSize)
	c.fr = http2.NewFramer(nil, c.br)          // writes are ours (writeLoop)
	c.fr.SetMaxReadFrameSize(defaultFrameSize) // what we allow (RFC 9113, 4.2)
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
		c.linger()
	}
	c.closeWith(err)
	<-c.writerDone
	if r, ok := c.closeReason.Load().(error); ok && !errors.Is(r, io.EOF) && !errors.Is(r, net.ErrClosed) && !errors.Is(r, os.ErrDeadlineExceeded) {
		c.srv.opts.Logger.Debug("grpcunary: connection ended", "remote", c.nc.RemoteAddr().String(), "error", r.Error())
	}
}

// linger lets a GOAWAY leave and the peer read it: it waits for the writer
// (which ends our side with a FIN after the GOAWAY) and then for the peer
// to close its side, at most closeGrace each. Closing a socket with unread
// input would make the kernel reset the connection, and a reset can destroy
// the GOAWAY in the peer's receive buffer before the peer reads it.
func (c *conn) linger() {
	select {
	case <-c.writerDone:
	case <-time.After(closeGrace):
		return // the peer does not read
	}
	io.Copy(io.Discard, c.nc) // until the peer's FIN, or closeWrite's deadline
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

	if err := c.readPreface(); err != nil {
		return err
	}
	for {
		// A batch leaves when the reader would wait for the network: it
		// holds every complete call read so far.
		if len(c.pending) > 0 && c.br.Buffered() == 0 {
			c.flushBatch()
		}
		fh, err := c.fr.ReadFrameHeader()
		var f http2.Frame
		if err == nil {
			f, err = c.fr.ReadFrameForHeader(fh)
		}
		if err != nil {
			if err := c.onReadError(fh, err); err != nil {
				return err
			}
			continue
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

// readPreface reads the client's connection preface; a wrong one is a
// connection error (RFC 9113, 3.4).
func (c *conn) readPreface() error {
	c.nc.SetReadDeadline(time.Now().Add(c.srv.opts.HandshakeTimeout))
	var preface [len(clientPreface)]byte
	if _, err := io.ReadFull(c.nc, preface[:]); err != nil {
		return err
	}
	if string(preface[:]) != clientPreface {
		return c.goAway(http2.ErrCodeProtocol, errors.New("grpcunary: not an HTTP/2 client preface"))
	}
	c.nc.SetReadDeadline(time.Time{})
	return nil
}

// onReadError handles an error of the Framer reading a frame with header
// fh: it returns the error that ends the connection, or nil when a stream
// error was enough.
func (c *conn) onReadError(fh http2.FrameHeader, err error) error {
	var se http2.StreamError
	var ce http2.ConnectionError
	switch {
	case errors.As(err, &se):
		return c.onStreamError(fh, se)
	case errors.As(err, &ce):
		return c.goAway(http2.ErrCode(ce), err)
	case errors.Is(err, http2.ErrFrameTooLarge):
		return c.goAway(http2.ErrCodeFrameSize, err) // RFC 9113, 4.2
	}
	return err
}

// onStreamError handles a stream error the Framer found in a frame with
// header fh. A request whose header block is malformed opens its stream
// and is reset; a HEADERS frame whose block was not decoded (bad padding)
// leaves the HPACK state unknown, and an error on an idle stream cannot be
// answered with RST_STREAM (RFC 9113, 5.1): both end the connection.
func (c *conn) onStreamError(fh http2.FrameHeader, se http2.StreamError) error {
	id := se.StreamID
	if fh.Type == http2.FrameHeaders && se.Cause == nil {
		return c.goAway(http2.ErrCodeProtocol, se) // RFC 9113, 6.2
	}
	c.mu.Lock()
	idle := c.idleLocked(id)
	opens := idle && fh.Type == http2.FrameHeaders && id%2 == 1
	if opens {
		c.maxStreamID = id
	}
	c.mu.Unlock()
	if idle && !opens {
		return c.goAway(http2.ErrCodeProtocol, se)
	}
	c.resetStream(id, se.Code)
	return nil
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
	case *http2.PriorityFrame:
		if f.StreamDep == f.StreamID {
			return http2.ConnectionError(http2.ErrCodeProtocol) // RFC 9113, 5.3.1 (a connection error, as nghttp2 makes it)
		}
	case *http2.PushPromiseFrame:
		return http2.ConnectionError(http2.ErrCodeProtocol) // clients never push
	case *http2.GoAwayFrame:
		// The client opens no more streams; the open ones are answered.
	}
	// PRIORITY and unknown frame types are ignored (RFC 9113, 5.5 and 5.3.2).
	return nil
}

// onHeaders takes a HEADERS frame: a new stream's request, which it checks
// and either dispatches (a request without body cannot be a unary call, so
// that is an error answer too) or keeps waiting for its DATA; or the end of
// an open stream's request.
func (c *conn) onHeaders(f *http2.MetaHeadersFrame) error {
	id := f.StreamID
	if id%2 == 0 {
		return http2.ConnectionError(http2.ErrCodeProtocol) // RFC 9113, 5.1.1
	}
	if f.HasPriority() && f.Priority.StreamDep == id {
		return http2.ConnectionError(http2.ErrCodeProtocol) // RFC 9113, 5.3.1 (a connection error, as nghttp2 makes it)
	}
	st, fresh, err := c.openStream(id)
	if st == nil || err != nil {
		return err
	}
	if !fresh {
		c.onTrailers(st, f)
		return nil
	}
	if f.StreamEnded() {
		st.remoteDone.Store(true)
	}
	c.startCall(st, f)
	return nil
}

// openStream returns stream id for a HEADERS frame: an open one, or a new
// one (fresh). It returns nil when the stream is refused or the frame is to
// be ignored, and a connection error for a closed stream.
func (c *conn) openStream(id uint32) (st *stream, fresh bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st := c.streams[id]; st != nil {
		return st, false, nil
	}
	if id <= c.maxStreamID {
		if c.resetByUsLocked(id) {
			return nil, false, nil // in flight when our RST_STREAM left (RFC 9113, 5.1)
		}
		return nil, false, http2.ConnectionError(http2.ErrCodeProtocol) // closed, or skipped (RFC 9113, 5.1.1)
	}
	c.maxStreamID = id
	if c.draining || uint32(len(c.streams)) >= c.srv.opts.MaxConcurrentStreams {
		// After the GOAWAY, or over the limit: refused, and the client
		// knows the call was not processed (RFC 9113, 8.7).
		c.resetLocked(id, http2.ErrCodeRefusedStream)
		c.signalLocked()
		return nil, false, nil
	}
	st = &stream{id: id, sendWin: c.peerInitial, recvAvail: recvStreamWindow, contentLength: -1}
	c.streams[id] = st
	return st, true, nil
}

// onTrailers takes a HEADERS frame on an open stream. gRPC clients send no
// trailers, but a well-formed block that ends the request is accepted.
func (c *conn) onTrailers(st *stream, f *http2.MetaHeadersFrame) {
	switch {
	case st.remoteDone.Load():
		c.resetStream(st.id, http2.ErrCodeStreamClosed) // half-closed (remote): RFC 9113, 5.1
	case !f.StreamEnded() || f.Truncated || len(f.PseudoFields()) > 0:
		c.resetStream(st.id, http2.ErrCodeProtocol) // malformed: RFC 9113, 8.1
	default:
		c.endRequest(st)
	}
}

// startCall checks a new stream's request headers and prepares its call,
// or answers it at once.
func (c *conn) startCall(st *stream, f *http2.MetaHeadersFrame) {
	if f.Truncated {
		c.answerHTTP(st, 431)
		return
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
				c.resetStream(st.id, http2.ErrCodeProtocol)
				return
			}
			st.contentLength = n
		case "connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade":
			c.resetStream(st.id, http2.ErrCodeProtocol) // RFC 9113, 8.2.2
			return
		case "te":
			if hf.Value != "trailers" {
				c.resetStream(st.id, http2.ErrCodeProtocol)
				return
			}
		default:
			if strings.HasPrefix(hf.Name, ":") {
				c.resetStream(st.id, http2.ErrCodeProtocol) // a response pseudo-header in a request
				return
			}
		}
	}
	if method == "" || path == "" || scheme == "" {
		c.resetStream(st.id, http2.ErrCodeProtocol) // RFC 9113, 8.3.1
		return
	}
	switch {
	case method != "POST":
		c.answerHTTP(st, 405)
		return
	case !isGRPCContentType(contentType):
		c.answerHTTP(st, 415)
		return
	}
	h := c.srv.methods[path]
	if h == nil {
		c.answerStatus(st, codes.Unimplemented, "grpcunary: unknown method "+path)
		return
	}
	if encoding != "" && encoding != "identity" {
		c.answerStatus(st, codes.Unimplemented, "grpcunary: grpc-encoding "+encoding+" is not supported")
		return
	}
	st.method = h
	if timeout != "" {
		d, ok := parseTimeout(timeout)
		if !ok {
			c.answerStatus(st, codes.Internal, "grpcunary: malformed grpc-timeout "+strconv.Quote(timeout))
			return
		}
		st.ctx, st.cancel = context.WithTimeout(c.ctx, d)
	} else {
		st.ctx, st.cancel = context.WithCancel(c.ctx)
	}
	if st.remoteDone.Load() {
		c.endRequest(st)
	}
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
	if err := c.takeConnWindow(n); err != nil {
		return err
	}
	c.mu.Lock()
	st := c.streams[id]
	idle := c.idleLocked(id)
	ours := st == nil && c.resetByUsLocked(id)
	c.mu.Unlock()
	switch {
	case st != nil:
	case idle:
		return http2.ConnectionError(http2.ErrCodeProtocol) // RFC 9113, 5.1
	case ours:
		return nil // in flight when our RST_STREAM left (RFC 9113, 5.1)
	default:
		c.resetStream(id, http2.ErrCodeStreamClosed) // RFC 9113, 6.1
		return nil
	}
	if st.remoteDone.Load() {
		c.resetStream(id, http2.ErrCodeStreamClosed) // half-closed (remote)
		return nil
	}
	st.recvAvail -= n
	if st.recvAvail < 0 {
		c.resetStream(id, http2.ErrCodeFlowControl)
		return nil
	}
	st.received += int64(len(f.Data()))
	if st.contentLength >= 0 && st.received > st.contentLength {
		c.resetStream(id, http2.ErrCodeProtocol) // RFC 9113, 8.1.1
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

// takeConnWindow accounts n bytes of DATA, on any stream, against the
// connection's receive window. The window is returned as soon as half of it
// is used: a stream's data is bounded by MaxRecvMsgSize, and the stream
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
		c.mu.Unlock()
		c.signal()
	}
	return nil
}

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
	c.noteResetLocked(id)
}

// noteResetLocked remembers that we reset stream id.
func (c *conn) noteResetLocked(id uint32) {
	c.resets[c.resetNext] = id
	c.resetNext = (c.resetNext + 1) % len(c.resets)
}

// endRequest handles the end of a request: the call is checked and run.
func (c *conn) endRequest(st *stream) {
	st.remoteDone.Store(true)
	if st.discard {
		return
	}
	body := st.body
	st.body = nil
	if st.contentLength >= 0 && st.contentLength != st.received {
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
	if st.method.batch == nil {
		c.srv.dispatch(call{c: c, st: st, req: body[5:]})
		return
	}
	if len(c.pending) > 0 && c.pendingM != st.method {
		c.flushBatch()
	}
	st.req = body[5:]
	c.pending = append(c.pending, st)
	c.pendingM = st.method
	if len(c.pending) >= MaxBatch {
		c.flushBatch()
	}
}

// flushBatch hands the pending batch to a worker.
func (c *conn) flushBatch() {
	if len(c.pending) == 0 {
		return
	}
	batch := append([]*stream(nil), c.pending...)
	clear(c.pending)
	c.pending = c.pending[:0]
	c.srv.dispatch(call{c: c, batch: batch, m: c.pendingM})
}

// runBatch calls a batch handler and queues the answers.
func (c *conn) runBatch(sts []*stream, h BatchHandler) {
	calls := make([]Call, len(sts))
	for i, st := range sts {
		calls[i].Ctx, calls[i].Req = st.ctx, st.req
	}
	h(c.ctx, calls)
	for i, st := range sts {
		st.req = nil
		c.answer(st, calls[i].Resp, calls[i].Err)
	}
	c.queueAll(sts)
}

// run calls the handler and queues its answer.
func (c *conn) run(st *stream, req []byte) {
	resp, err := st.method.unary(st.ctx, req)
	c.answer(st, resp, err)
	c.queue(st)
}

// answer sets st's answer: resp, or err as a gRPC status.
func (c *conn) answer(st *stream, resp []byte, err error) {
	if err != nil {
		code, msg := statusOf(err)
		st.trl = appendTrailersOnly(nil, code, msg)
		return
	}
	msg := make([]byte, 5+len(resp))
	binary.BigEndian.PutUint32(msg[1:5], uint32(len(resp)))
	copy(msg[5:], resp)
	st.ok, st.msg = true, msg
}

// queueAll hands answered streams to the writer, in one go.
func (c *conn) queueAll(sts []*stream) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	n := len(c.ready)
	for _, st := range sts {
		if !st.reset {
			c.ready = append(c.ready, st)
		}
	}
	queued := len(c.ready) > n
	c.mu.Unlock()
	if queued {
		c.signal()
	}
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
func (c *conn) queue(st *stream) { c.queueAll([]*stream{st}) }

// resetStream ends stream id with RST_STREAM code: its answer, if any, is
// dropped and its call's context cancelled.
func (c *conn) resetStream(id uint32, code http2.ErrCode) {
	c.mu.Lock()
	st := c.takeStreamLocked(id)
	c.resetLocked(id, code)
	c.mu.Unlock()
	cancelStream(st)
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
	c.mu.Unlock()
	if st != nil {
		cancelStream(st)
		c.closeIfDrained()
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
// takeStreamLocked (nil: none) and cancels its call's context.
func cancelStream(st *stream) {
	if st == nil {
		return
	}
	st.discard = true
	if st.cancel != nil {
		st.cancel()
	}
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

// goAway sends GOAWAY code, after which the connection closes; it returns
// err, the reason. The last stream it names is the last the client opened,
// or the one a graceful stop's GOAWAY named (RFC 9113, 6.8: it cannot grow).
func (c *conn) goAway(code http2.ErrCode, err error) error {
	c.mu.Lock()
	last := c.maxStreamID
	if c.draining {
		last = c.goAwayID
	}
	c.ctrl = appendGoAway(c.ctrl, last, code)
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
