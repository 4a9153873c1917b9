package grpcunary

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/peer"
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
	hdec        *headerDecoder
	pending     []*stream // complete calls of a batch method, not yet handed over...
	pendingM    *method   // ...and their method
	sawSettings bool
	recvConn    int64 // what the peer may still send on the connection

	// The request buffer of streams the reader owns (budget.go): bmu
	// guards it, and the streams' charged, dispatched and expired, against
	// the sweeper and other connections, which may free it.
	bmu     sync.Mutex
	held    atomic.Int64 // charged to streams the reader owns (read without bmu to pick whom to shed)
	bufDone bool         // the connection ended: nothing more is charged or freed

	wake        chan struct{} // capacity 1: there is something to write
	writerDone  chan struct{}
	closeOnce   sync.Once
	closeReason atomic.Value // error, for the debug log
	buffered    atomic.Int64 // request bytes held (Options.MaxConnBufferBytes)
	calm        atomic.Bool  // too many control frames queued: end the connection

	// The writer's own state.
	enc   encoder // HPACK state of the blocks we send
	block []byte  // the header block being written

	mu          sync.Mutex
	streams     map[uint32]*stream // open streams: received, not yet fully answered
	maxStreamID uint32             // the highest stream the client opened
	ctrl        []byte             // control frames to write, in order
	ctrlFrames  int                // ...how many
	ready       []*stream          // answers to write, in order
	sendConn    int64              // what we may still send on the connection
	peerInitial int64              // the peer's SETTINGS_INITIAL_WINDOW_SIZE
	peerFrame   uint32             // the peer's SETTINGS_MAX_FRAME_SIZE
	peerTable   uint32             // the peer's SETTINGS_HEADER_TABLE_SIZE...
	tableSet    bool               // ...newly set: the writer's HPACK state must follow
	draining    bool               // GOAWAY sent: no new streams, close when the last is answered...
	drainPing   bool               // ...and the PING sent after the GOAWAY is acknowledged
	goAwayID    uint32             // the last stream a draining connection answers
	fatal       bool               // a connection error: close once the GOAWAY is written
	closed      bool
	// The last streams we reset while the client may still have been
	// sending (a ring; 0 is no stream): frames that were in flight when
	// the RST_STREAM left are ignored on them, while frames on other
	// closed streams are errors (RFC 9113, 5.1).
	resets    [recentResets]uint32
	resetNext int
	// Rapid reset: streams opened, and the client's resets of streams
	// whose call had not started, since resetWindowStart streams.
	opened           uint64
	resetWindowStart uint64
	earlyResets      int
	// The sweeps': when the connection began, whether the client's
	// SETTINGS came, and the sweeps' own state (see conn.sweep).
	born       time.Time
	handshook  bool
	idleSince  time.Time
	lastOpened uint64
	endBy      time.Time
	// Calls answered (queued for the writer): a connection that has
	// answered none is closed after FirstCallTimeout, and is among the
	// first to make room at MaxConns.
	answered uint64

	evicted  bool        // guarded by Server.mu: closed to make room (Server.closing counts it)
	evicting atomic.Bool // the same, for the writer
}

// stream is one call.
type stream struct {
	id     uint32
	method *method
	req    []byte   // the request message, once the request is complete
	ctx    *callCtx // the call's context; nil until the call starts
	hdrs   []Header // the headers Options.KeepHeaders names

	// The reader's, until the call is dispatched.
	body          []byte
	recvAvail     int64 // what the peer may still send on the stream
	recvUnacked   int64 // consumed, not yet returned by WINDOW_UPDATE
	contentLength int64 // -1: not given
	received      int64 // bytes of DATA received (padding aside)
	discard       bool  // answered early: ignore its data
	early         bool  // an answer waits for the end of the request (queued then)
	dispatched    bool  // handed over to run (a batch, or a worker), with its request buffer (conn.bmu)
	charged       int64 // request buffer bytes: the reader's (conn.bmu), then the worker's
	expired       bool  // reset by the sweeper or shed before it was complete (conn.bmu)
	// The sweeps': when one first saw the request unfinished.
	unfinishedSince time.Time
	remoteDone      atomic.Bool

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
		peerFrame: defaultFrameSize, recvConn: recvConnWindow, born: s.now(),
	}
	c.idleSince = c.born
	// The peer, as grpc-go gives it: the control plane shares budgets by
	// client address.
	c.ctx, c.cancel = context.WithCancel(peer.NewContext(context.Background(), &peer.Peer{Addr: nc.RemoteAddr(), LocalAddr: nc.LocalAddr()}))
	// Reads go through a buffer: the Framer reads a frame header and then
	// its payload, two reads a frame, which would be two system calls.
	c.br = bufio.NewReaderSize(nc, readBufferSize)
	c.fr = http2.NewFramer(nil, c.br)          // writes are ours (writeLoop)
	c.fr.SetMaxReadFrameSize(defaultFrameSize) // what we allow (RFC 9113, 4.2)
	c.hdec = newHeaderDecoder(s.opts.MaxHeaderBytes)
	return c
}

// serve runs the connection: it starts the writer, reads frames until the
// connection ends, and cleans up.
func (c *conn) serve() {
	defer c.srv.forget(c)
	go c.writeLoop()
	err := c.readLoop()
	c.releaseHeld() // requests still being received, or not handed over
	clear(c.pending)
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
		{ID: http2.SettingMaxConcurrentStreams, Val: c.srv.opts.MaxStreamsPerConn},
		{ID: http2.SettingInitialWindowSize, Val: recvStreamWindow},
		{ID: http2.SettingMaxHeaderListSize, Val: c.srv.opts.MaxHeaderBytes},
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
		switch {
		case err != nil:
		case fh.Type == http2.FrameHeaders:
			f, err = c.readHeaders(fh)
		default:
			f, err = c.fr.ReadFrameForHeader(fh)
		}
		if err != nil {
			if err := c.onReadError(fh, err); err != nil {
				return err
			}
			if c.calm.Load() {
				return c.goAway(http2.ErrCodeEnhanceYourCalm, errCtrlFlood)
			}
			continue
		}
		if !c.sawSettings {
			if _, ok := f.(*http2.SettingsFrame); !ok {
				return c.goAway(http2.ErrCodeProtocol, errors.New("grpcunary: the first frame is not SETTINGS"))
			}
			c.sawSettings = true
			c.mu.Lock()
			c.handshook = true
			c.mu.Unlock()
		}
		if err := c.handleFrame(f); err != nil {
			var ce http2.ConnectionError
			if errors.As(err, &ce) {
				return c.goAway(http2.ErrCode(ce), err)
			}
			return err
		}
		if c.calm.Load() {
			return c.goAway(http2.ErrCodeEnhanceYourCalm, errCtrlFlood)
		}
	}
}

// readPreface reads the client's connection preface; a wrong one is a
// connection error (RFC 9113, 3.4). (The sweeps bound the wait for it.)
func (c *conn) readPreface() error {
	var preface [len(clientPreface)]byte
	if _, err := io.ReadFull(c.nc, preface[:]); err != nil {
		return err
	}
	if string(preface[:]) != clientPreface {
		return c.goAway(http2.ErrCodeProtocol, errors.New("grpcunary: not an HTTP/2 client preface"))
	}
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
		if f.IsAck() {
			if f.Data == drainPingData {
				c.drainPinged()
			}
			break
		}
		c.mu.Lock()
		c.ctrl = appendPing(c.ctrl, f.Data)
		c.ctrlQueuedLocked()
		c.mu.Unlock()
		c.signal()
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

// drainPingData marks the PING that follows a graceful GOAWAY.
var drainPingData = [8]byte{'g', 'o', 'a', 'w', 'a', 'y'}

// drain starts a graceful stop: GOAWAY naming the last stream answered,
// then a PING; the connection closes once those streams are answered and
// the PING is acknowledged (or closeGrace has passed). A call the client
// sent before it read the GOAWAY arrives before the PING's ACK, and is
// refused with REFUSED_STREAM, which clients retry, instead of meeting a
// closed connection (RFC 9113, 6.8).
func (c *conn) drain() {
	c.mu.Lock()
	if c.closed || c.draining {
		c.mu.Unlock()
		return
	}
	c.draining, c.drainPing = true, true
	c.goAwayID = c.maxStreamID
	c.ctrl = appendGoAway(c.ctrl, c.goAwayID, http2.ErrCodeNo)
	c.ctrl = appendFrameHeader(c.ctrl, 8, http2.FramePing, 0, 0)
	c.ctrl = append(c.ctrl, drainPingData[:]...)
	c.mu.Unlock()
	c.signal()
	time.AfterFunc(closeGrace, c.drainPinged) // a peer that does not answer
}

// drainPinged follows the ACK of the drain's PING, or closeGrace.
func (c *conn) drainPinged() {
	c.mu.Lock()
	c.drainPing = false
	c.mu.Unlock()
	c.closeIfDrained()
}

// closeIfDrained tells the writer to close a draining connection that has
// no open stream left (after writing what is queued).
func (c *conn) closeIfDrained() {
	c.mu.Lock()
	if c.draining && !c.drainPing && len(c.streams) == 0 {
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
