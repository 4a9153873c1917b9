package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"runtime"
	"strconv"
	"sync"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/proto"
)

// leanConn is one HTTP/2 connection carrying ShouldRateLimit calls, written
// for the load tool so that the tool spends little of the CPU it shares with
// the servers it measures: a call is one HEADERS and one DATA frame out and
// HEADERS, DATA and trailing HEADERS back, with nothing else done per call
// (no name resolution, balancing, retries, compression, interceptors or
// per-call goroutines). It speaks plain gRPC over cleartext HTTP/2 (h2c
// with prior knowledge), as grpc-go's client does, and honours the peer's
// flow control and stream limit. The grpc-go client stays available
// (-client grpc) to cross-check it.
type leanConn struct {
	nc        net.Conn
	authority string

	mu       sync.Mutex
	cond     *sync.Cond // signalled when window, streams or err change
	out      bytes.Buffer
	outFr    *http2.Framer // writes frames into out
	henc     *hpack.Encoder
	hbuf     bytes.Buffer
	hblock   []byte        // the header block every call sends, once it repeats
	wake     chan struct{} // tells the writer that out has frames (buffered)
	nextID   uint32        // the next stream ID
	streams  map[uint32]*leanCall
	window   int64  // what we may still send on the connection
	streamWn int64  // the peer's initial stream window (a call sends far less)
	maxOpen  uint32 // the peer's MAX_CONCURRENT_STREAMS
	err      error  // the connection failed; every call fails
	unacked  uint32 // received DATA bytes not yet returned by WINDOW_UPDATE
	timeout  string // the grpc-timeout header value, "" for none

	// The reader's header decoding state.
	dec    *hpack.Decoder
	cur    *leanCall // the call whose headers are being decoded (nil: none)
	curID  uint32    // its stream
	curEnd bool      // the block ends the stream
}

// Flow-control settings of the tool's side: large windows, so that the peer
// never waits on the tool.
const (
	leanStreamWindow = 1 << 20
	leanConnWindow   = 1 << 30
)

// leanCall is one call in flight.
type leanCall struct {
	done    chan struct{} // receives one value when the call ends (buffered)
	status  string        // :status
	grpc    string        // grpc-status
	message string        // grpc-message
	data    []byte        // the response's DATA
	err     error
}

// dialLean connects to addr and starts reading. timeout, if positive, is
// sent as each call's grpc-timeout.
func dialLean(ctx context.Context, addr string, timeout time.Duration) (*leanConn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c := &leanConn{nc: nc, authority: addr, nextID: 1, streams: map[uint32]*leanCall{},
		window: 65535, streamWn: 65535, maxOpen: math.MaxUint32, wake: make(chan struct{}, 1)}
	c.cond = sync.NewCond(&c.mu)
	c.outFr = http2.NewFramer(&c.out, nil)
	c.henc = hpack.NewEncoder(&c.hbuf)
	if timeout > 0 {
		c.timeout = strconv.FormatInt(max(timeout.Milliseconds(), 1), 10) + "m"
	}
	c.out.WriteString(http2.ClientPreface)
	c.outFr.WriteSettings(
		http2.Setting{ID: http2.SettingEnablePush, Val: 0},
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: leanStreamWindow})
	c.outFr.WriteWindowUpdate(0, leanConnWindow-65535)
	if _, err := nc.Write(c.out.Bytes()); err != nil {
		nc.Close()
		return nil, err
	}
	c.out.Reset()
	go c.read()
	go c.write()
	return c, nil
}

// Close closes the connection; calls in flight fail.
func (c *leanConn) Close() error { return c.nc.Close() }

// call sends msg (a gRPC-framed request) on a new stream and waits for the
// answer, the end of ctx, expire (the call's timeout) or the end of the
// connection.
func (c *leanConn) call(ctx context.Context, expire <-chan time.Time, lc *leanCall, msg []byte) (rlsv3.RateLimitResponse_Code, error) {
	if int64(len(msg)) > c.streamWn {
		return 0, fmt.Errorf("request of %d bytes exceeds the server's stream window", len(msg))
	}
	c.mu.Lock()
	for c.err == nil && (uint32(len(c.streams)) >= c.maxOpen || c.window < int64(len(msg))) {
		c.cond.Wait()
	}
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return 0, err
	}
	id := c.nextID
	c.nextID += 2
	lc.status, lc.grpc, lc.message, lc.data, lc.err = "", "", "", lc.data[:0], nil
	c.streams[id] = lc
	block := c.hblock
	if block == nil {
		c.encodeHeaders()
		block = c.hbuf.Bytes()
	}
	c.outFr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndHeaders: true})
	c.outFr.WriteData(id, true, msg)
	c.window -= int64(len(msg))
	c.kickLocked()
	c.mu.Unlock()
	return c.await(ctx, expire, id, lc)
}

// encodeHeaders encodes a call's headers into hbuf (c.mu held). Every call
// sends the same headers, so once the encoder has them all in its dynamic
// table (after the first call) the block is the same each time: when a
// block repeats the previous one it is kept in hblock and reused.
func (c *leanConn) encodeHeaders() {
	prev := append([]byte(nil), c.hbuf.Bytes()...)
	c.hbuf.Reset()
	for _, f := range [...]hpack.HeaderField{
		{Name: ":method", Value: "POST"},
		{Name: ":scheme", Value: "http"},
		{Name: ":path", Value: "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"},
		{Name: ":authority", Value: c.authority},
		{Name: "content-type", Value: "application/grpc"},
		{Name: "te", Value: "trailers"},
		{Name: "user-agent", Value: "sluice-load"},
	} {
		c.henc.WriteField(f)
	}
	if c.timeout != "" {
		c.henc.WriteField(hpack.HeaderField{Name: "grpc-timeout", Value: c.timeout})
	}
	if bytes.Equal(prev, c.hbuf.Bytes()) {
		c.hblock = prev
	}
}

// await waits for call id's answer, the end of ctx, expire or the end of
// the connection.
func (c *leanConn) await(ctx context.Context, expire <-chan time.Time, id uint32, lc *leanCall) (rlsv3.RateLimitResponse_Code, error) {
	var cause error
	select {
	case <-lc.done:
		return lc.result()
	case <-ctx.Done():
		cause = ctx.Err()
	case <-expire:
		cause = context.DeadlineExceeded
	}
	c.mu.Lock()
	if _, open := c.streams[id]; open {
		delete(c.streams, id)
		c.outFr.WriteRSTStream(id, http2.ErrCodeCancel)
		c.kickLocked()
		c.cond.Broadcast()
		c.mu.Unlock()
		return 0, cause
	}
	c.mu.Unlock()
	<-lc.done // the reader is delivering it
	return lc.result()
}

// result turns what the reader gathered into the call's outcome.
func (lc *leanCall) result() (rlsv3.RateLimitResponse_Code, error) {
	switch {
	case lc.err != nil:
		return 0, lc.err
	case lc.status != "200":
		return 0, fmt.Errorf("HTTP status %q", lc.status)
	case lc.grpc != "0":
		return 0, fmt.Errorf("grpc-status %s: %s", lc.grpc, lc.message)
	case len(lc.data) < 5 || lc.data[0] != 0:
		return 0, fmt.Errorf("response is not one uncompressed gRPC message (%d bytes)", len(lc.data))
	}
	n := binary.BigEndian.Uint32(lc.data[1:5])
	if int(n) != len(lc.data)-5 {
		return 0, fmt.Errorf("gRPC message of %d bytes announced as %d", len(lc.data)-5, n)
	}
	return overallCode(lc.data[5:])
}

// kickLocked tells the writer that out holds frames; c.mu is held.
func (c *leanConn) kickLocked() {
	select {
	case c.wake <- struct{}{}:
	default: // already told
	}
}

// write writes out whatever frames have queued, in one write each time it
// wakes: under load the requests of many callers leave in one syscall, as
// grpc-go's writer batches them.
func (c *leanConn) write() {
	var buf []byte
	for range c.wake {
		// Let the callers that are about to send run first: their frames
		// then leave in this write rather than each in its own.
		runtime.Gosched()
		c.mu.Lock()
		if c.err != nil {
			c.mu.Unlock()
			return
		}
		buf = append(buf[:0], c.out.Bytes()...)
		c.out.Reset()
		c.mu.Unlock()
		if len(buf) == 0 {
			continue
		}
		if _, err := c.nc.Write(buf); err != nil {
			c.mu.Lock()
			c.failLocked(err)
			c.mu.Unlock()
			return
		}
	}
}

// failLocked ends the connection: every call in flight fails with err.
func (c *leanConn) failLocked(err error) {
	if c.err == nil {
		c.err = err
	}
	for id, lc := range c.streams {
		lc.err = c.err
		delete(c.streams, id)
		lc.done <- struct{}{}
	}
	c.cond.Broadcast()
}

// read reads frames until the connection ends.
func (c *leanConn) read() {
	fr := http2.NewFramer(nil, bufio.NewReaderSize(c.nc, 64<<10))
	fr.SetReuseFrames()
	c.dec = hpack.NewDecoder(4096, c.header)
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			c.mu.Lock()
			if errors.Is(err, io.EOF) {
				err = errors.New("connection closed by the server")
			}
			c.failLocked(err)
			c.kickLocked() // the writer sees err and ends
			c.mu.Unlock()
			c.nc.Close()
			return
		}
		c.mu.Lock()
		c.handle(f)
		c.mu.Unlock()
	}
}

// handle processes one frame; c.mu is held.
func (c *leanConn) handle(f http2.Frame) {
	switch f := f.(type) {
	case *http2.HeadersFrame:
		// Every header block is decoded, for the decoder's table, even
		// that of a call that gave up (cur is then nil).
		c.cur, c.curID, c.curEnd = c.streams[f.StreamID], f.StreamID, f.StreamEnded()
		c.headerBlock(f.HeaderBlockFragment(), f.HeadersEnded())
	case *http2.ContinuationFrame:
		c.headerBlock(f.HeaderBlockFragment(), f.HeadersEnded())
	case *http2.DataFrame:
		c.unacked += f.Length
		if c.unacked >= leanConnWindow/4 {
			c.outFr.WriteWindowUpdate(0, c.unacked)
			c.unacked = 0
			c.kickLocked()
		}
		if lc := c.streams[f.StreamID]; lc != nil {
			lc.data = append(lc.data, f.Data()...)
			if f.StreamEnded() {
				c.finish(f.StreamID, lc)
			}
		}
	case *http2.SettingsFrame:
		if f.IsAck() {
			return
		}
		f.ForeachSetting(func(s http2.Setting) error {
			switch s.ID {
			case http2.SettingMaxConcurrentStreams:
				c.maxOpen = s.Val
			case http2.SettingInitialWindowSize:
				c.streamWn = int64(s.Val)
			}
			return nil
		})
		c.outFr.WriteSettingsAck()
		c.kickLocked()
		c.cond.Broadcast()
	case *http2.PingFrame:
		if !f.IsAck() {
			c.outFr.WritePing(true, f.Data)
			c.kickLocked()
		}
	case *http2.WindowUpdateFrame:
		if f.StreamID == 0 {
			c.window += int64(f.Increment)
			c.cond.Broadcast()
		}
	case *http2.RSTStreamFrame:
		if lc := c.streams[f.StreamID]; lc != nil {
			if f.ErrCode == http2.ErrCodeCancel && c.timeout != "" {
				// grpc-go's server resets with CANCEL when the grpc-timeout
				// we sent runs out, which can reach us before our own timer.
				lc.err = fmt.Errorf("%w: the server cancelled the call at its grpc-timeout", context.DeadlineExceeded)
			} else {
				lc.err = fmt.Errorf("stream reset by the server: %v", f.ErrCode)
			}
			c.finish(f.StreamID, lc)
		}
	case *http2.GoAwayFrame:
		c.failLocked(fmt.Errorf("server sent GOAWAY (%v)", f.ErrCode))
	}
}

// headerBlock decodes a part of the current header block; at its end, a
// block that ends the stream ends the call. c.mu is held.
func (c *leanConn) headerBlock(frag []byte, end bool) {
	_, err := c.dec.Write(frag)
	if err == nil && end {
		err = c.dec.Close()
	}
	if err != nil {
		// The decoder's state is lost: so is the connection.
		c.failLocked(fmt.Errorf("response headers: %w", err))
		c.nc.Close()
		return
	}
	if !end {
		return
	}
	if c.cur != nil && c.curEnd {
		c.finish(c.curID, c.cur)
	}
	c.cur = nil
}

// header records one decoded response header on the current call.
func (c *leanConn) header(h hpack.HeaderField) {
	if c.cur == nil {
		return
	}
	switch h.Name {
	case ":status":
		c.cur.status = h.Value
	case "grpc-status":
		c.cur.grpc = h.Value
	case "grpc-message":
		c.cur.message = h.Value
	}
}

// finish ends a call; c.mu is held.
func (c *leanConn) finish(id uint32, lc *leanCall) {
	delete(c.streams, id)
	lc.done <- struct{}{}
	c.cond.Broadcast()
}

// leanCaller is one caller's reusable state: a call costs no allocation.
type leanCaller struct {
	conn    *leanConn
	timeout time.Duration
	timer   *time.Timer
	lc      leanCall
	msg     []byte // the gRPC-framed request
}

func newLeanCaller(c *leanConn, timeout time.Duration) *leanCaller {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &leanCaller{conn: c, timeout: timeout, timer: t, lc: leanCall{done: make(chan struct{}, 1)}}
}

// ShouldRateLimit encodes req, calls it and returns the overall code.
func (l *leanCaller) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (rlsv3.RateLimitResponse_Code, error) {
	b, err := proto.MarshalOptions{}.MarshalAppend(append(l.msg[:0], 0, 0, 0, 0, 0), req)
	if err != nil {
		return 0, err
	}
	binary.BigEndian.PutUint32(b[1:5], uint32(len(b)-5))
	l.msg = b
	l.timer.Reset(l.timeout)
	code, err := l.conn.call(ctx, l.timer.C, &l.lc, b)
	l.timer.Stop()
	return code, err
}
