package grpcunary

import (
	"encoding/binary"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
)

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
	c.opened++
	if c.draining || uint32(len(c.streams)) >= c.srv.opts.MaxStreamsPerConn {
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
	// The answers below are decided by the headers; each waits for the end
	// of the request (answerHTTP, answerStatus).
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
			if len(c.srv.opts.KeepHeaders) > 0 && slices.Contains(c.srv.opts.KeepHeaders, hf.Name) {
				st.hdrs = append(st.hdrs, Header{Name: hf.Name, Value: hf.Value})
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
	var d time.Duration
	if timeout != "" {
		var ok bool
		if d, ok = parseTimeout(timeout); !ok {
			c.answerStatus(st, codes.Internal, "grpcunary: malformed grpc-timeout "+strconv.Quote(timeout))
			return
		}
		d = max(d, 1) // "0n" is a deadline that has passed, not none
	}
	st.ctx = newCallCtx(c.ctx, d)
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
		if err := c.buffer(st, f.Data()); err != nil {
			// Refused at once, while the request still comes: the client
			// is told to stop sending (RST_STREAM NO_ERROR after it).
			c.answerNow(st, appendTrailersOnly(nil, codes.ResourceExhausted, c.refusal(err)))
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
		c.ctrlQueuedLocked()
		c.mu.Unlock()
		c.signal()
	}
	return nil
}

// endRequest handles the end of a request: the call is checked and run.
func (c *conn) endRequest(st *stream) {
	st.remoteDone.Store(true)
	if st.discard {
		if st.early {
			st.early = false
			c.queue(st)
		}
		return
	}
	body := st.body
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
	st.body = nil
	if st.method.batch == nil {
		if c.handOver(st) {
			c.srv.dispatch(call{c: c, st: st, req: body[5:]})
		}
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

// flushBatch decides the pending batch, on the reader.
func (c *conn) flushBatch() {
	if len(c.pending) == 0 {
		return
	}
	// A call reset before it starts is not decided (rapid reset,
	// CVE-2023-44487): it would spend the limits for nothing.
	batch := make([]*stream, 0, len(c.pending))
	for _, st := range c.pending {
		if st.discard {
			c.drop(st)
			continue
		}
		if c.handOver(st) {
			batch = append(batch, st)
		}
	}
	clear(c.pending)
	c.pending = c.pending[:0]
	if len(batch) > 0 {
		// On the reader: the calls that arrive while it runs wait in the
		// socket and form the next batch (see RATIONALE.md, "Batches").
		c.runBatch(batch, c.pendingM.batch)
	}
}

// runBatch calls a batch handler and queues the answers.
func (c *conn) runBatch(sts []*stream, h BatchHandler) {
	// Calls reset since they were handed over are not decided either.
	c.mu.Lock()
	live := sts[:0]
	for _, st := range sts {
		if st.reset {
			c.release(st)
			continue
		}
		live = append(live, st)
	}
	c.mu.Unlock()
	clear(sts[len(live):])
	sts = live
	if len(sts) == 0 {
		return
	}
	calls := make([]Call, len(sts))
	for i, st := range sts {
		// The answer's message goes right after its gRPC prefix, in
		// place, when the handler appends it to Resp (see answer).
		st.msg = make([]byte, 5, respCap)
		calls[i].Ctx, calls[i].Req, calls[i].Resp, calls[i].Headers = st.ctx, st.req, st.msg[5:], st.hdrs
	}
	h(c.ctx, calls)
	for i, st := range sts {
		st.req, st.hdrs = nil, nil
		c.answer(st, calls[i].Resp, calls[i].Err)
	}
	c.release(sts...)
	c.queueAll(sts)
}

// run calls the handler and queues its answer.
func (c *conn) run(st *stream, req []byte) {
	resp, err := st.method.unary(st.ctx, req)
	c.answer(st, resp, err)
	c.release(st)
	c.queue(st)
}

// answer sets st's answer: resp, or err as a gRPC status.
func (c *conn) answer(st *stream, resp []byte, err error) {
	if err != nil {
		code, msg := statusOf(err)
		st.trl, st.msg = appendTrailersOnly(nil, code, msg), nil
		return
	}
	var msg []byte
	if b := st.msg; len(resp) > 0 && cap(b) >= 5+len(resp) && &b[:6][5] == &resp[0] {
		msg = b[:5+len(resp)] // appended after the prefix: no copy
	} else {
		msg = make([]byte, 5+len(resp))
		copy(msg[5:], resp)
	}
	msg[0] = 0 // not compressed
	binary.BigEndian.PutUint32(msg[1:5], uint32(len(resp)))
	st.ok, st.msg = true, msg
}

// respCap is the capacity a batch call's Resp comes with (after the 5 bytes
// of its gRPC prefix): a ShouldRateLimit answer with sluice's metadata is
// 200-300 bytes.
const respCap = 512

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
	c.answered += uint64(len(c.ready) - n)
	c.mu.Unlock()
	if queued {
		c.signal()
	}
}

// answerStatus answers st with a gRPC error and ignores the rest of its
// request; the answer leaves once the request has ended.
func (c *conn) answerStatus(st *stream, code codes.Code, msg string) {
	c.answerAtEnd(st, appendTrailersOnly(nil, code, msg))
}

// answerHTTP is answerStatus with an HTTP status and no body (the request
// is not a gRPC call).
func (c *conn) answerHTTP(st *stream, status int) {
	c.answerAtEnd(st, appendHTTPStatus(nil, status))
}

// answerAtEnd answers st with the trailers-only block trl once its request
// has ended: an answer before the end would have to be followed by
// RST_STREAM NO_ERROR (RFC 9113, 8.1), which the client can receive before
// it has sent the rest, and which some clients (curl 7.88) report as a
// failed call.
func (c *conn) answerAtEnd(st *stream, trl []byte) {
	if !st.remoteDone.Load() {
		st.discard, st.early, st.trl = true, true, trl
		c.drop(st)
		return
	}
	c.answerNow(st, trl)
}

// answerNow answers st with the trailers-only block trl at once, and
// ignores the rest of its request.
func (c *conn) answerNow(st *stream, trl []byte) {
	st.discard, st.trl = true, trl
	c.drop(st)
	c.queue(st)
}

// queue hands an answered stream to the writer.
func (c *conn) queue(st *stream) { c.queueAll([]*stream{st}) }
