package grpcunary

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/controlplane/internal/connbounds"
)

// Handler answers one call: req is the request message (valid only during
// the call) and the result is the response message. An error is sent as a
// gRPC status (status.FromError: codes and messages of package
// google.golang.org/grpc/status survive; anything else is UNKNOWN).
type Handler func(ctx context.Context, req []byte) ([]byte, error)

// Options tune a Server. The zero value gives the defaults
// (connbounds.Default, connbounds.Workers).
type Options struct {
	// Bounds are the connections' bounds (RATIONALE.md, "Bounds"); zero
	// fields take connbounds.Default's. Past them:
	//   - MaxConns: a connection accepted at the cap makes room: the open
	//     connection nearest its idle timeout (FirstCallTimeout for those
	//     that have completed no call, IdleTimeout for the others) among
	//     those with no call in progress is sent GOAWAY NO_ERROR and
	//     closed. When none is (or as many as MaxConns are already
	//     closing), the new one is sent GOAWAY ENHANCE_YOUR_CALM and closed
	//     at once.
	//   - MaxStreamsPerConn: REFUSED_STREAM.
	//   - MaxMsgBytes: the call is answered RESOURCE_EXHAUSTED.
	//   - MaxHeaderBytes: HTTP 431. A header block of more than
	//     MaxHeaderBlock encoded bytes, or of more than
	//     connbounds.MaxContinuations CONTINUATION frames, ends the
	//     connection (GOAWAY ENHANCE_YOUR_CALM).
	//   - HandshakeTimeout (the client's preface and first SETTINGS):
	//     the connection is closed.
	//   - FirstCallTimeout (no call completed since the connection opened)
	//     and IdleTimeout (no new stream): GOAWAY NO_ERROR; streams still
	//     open then are cut two seconds later.
	//   - BodyTimeout: RST_STREAM CANCEL, the request's buffer freed
	//     (checked by the sweeps: at most a quarter more).
	//   - MaxConnBufferBytes (raised to MaxMsgBytes+5 if lower): the
	//     request is answered RESOURCE_EXHAUSTED, and the connection goes
	//     on.
	//   - MaxBufferBytes (raised to MaxConnBufferBytes if lower): a
	//     connection that holds nothing, or no more than its fair share
	//     (MaxBufferBytes over the open connections and one), takes room
	//     from the connection holding most beyond its share, whose
	//     unfinished requests are reset (RST_STREAM REFUSED_STREAM).
	connbounds.Bounds
	// KeepHeaders names request headers (lower case) that batch handlers
	// get in Call.Headers, e.g. the trace context ("traceparent"). Empty,
	// the default, keeps none and costs nothing. What is kept is bounded
	// by MaxHeaderBytes.
	KeepHeaders []string
	// Workers is how many goroutines the server keeps to run calls (0:
	// connbounds.Workers). A call that finds them all busy gets a
	// goroutine of its own.
	Workers int
	// Logger receives connection errors at debug level (nil: none).
	Logger *slog.Logger
}

func (o *Options) fill() {
	o.Bounds = o.Bounds.WithDefaults()
	o.MaxConnBufferBytes = max(o.MaxConnBufferBytes, int64(o.MaxMsgBytes)+5)
	o.MaxBufferBytes = max(o.MaxBufferBytes, o.MaxConnBufferBytes)
	if o.Workers <= 0 {
		o.Workers = connbounds.Workers
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// Stats are counts since the server started.
type Stats struct {
	ConnsOpen       int    // connections open now (those closing to make room too)
	ConnsRefused    uint64 // connections closed at once at MaxConns: none could make room
	ConnsEvicted    uint64 // idle connections closed to make room for a new one at MaxConns
	StreamsTimedOut uint64 // requests reset because their body was not complete after BodyTimeout
	StreamsShed     uint64 // unfinished requests reset to give room to a connection within its fair share
}

// Stats returns the server's counts.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	open := len(s.conns)
	s.mu.Unlock()
	return Stats{
		ConnsOpen:    open,
		ConnsRefused: s.refused.Load(), ConnsEvicted: s.evicted.Load(),
		StreamsTimedOut: s.timedOut.Load(), StreamsShed: s.shed.Load(),
	}
}

// ErrServerStopped is returned by Serve after GracefulStop or Stop.
var ErrServerStopped = errors.New("grpcunary: server stopped")

// Server serves unary gRPC methods. Register every method with Handle
// before Serve.
type Server struct {
	opts    Options
	methods map[string]*method

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[*conn]struct{}
	closing   int // connections in conns closed to make room, not yet ended
	stopping  bool
	connsDone *sync.Cond // signalled when a connection ends

	buffered  atomic.Int64     // request bytes held, all connections (Options.MaxBufferBytes)
	now       func() time.Time // the clock of the sweeps (tests set it)
	sweepOnce sync.Once

	refused, evicted, timedOut, shed atomic.Uint64 // Stats

	workersOnce sync.Once
	calls       chan call     // to the workers
	quit        chan struct{} // closed when the server stops: the workers end
	quitOnce    sync.Once
}

// method is how a method is served: one of the two.
type method struct {
	unary Handler
	batch BatchHandler
}

// call is work for a worker: a unary call's stream and request message.
// (Batches run on their connection's reader.)
type call struct {
	c   *conn
	st  *stream
	req []byte
}

// dispatch runs a call on an idle worker, or on a goroutine of its own when
// none is idle.
func (s *Server) dispatch(k call) {
	s.workersOnce.Do(func() {
		s.calls = make(chan call)
		for range s.opts.Workers {
			go s.work()
		}
	})
	select {
	case s.calls <- k:
	default:
		go k.run()
	}
}

// run does a worker's work.
func (k call) run() { k.c.run(k.st, k.req) }

// work is a worker: it runs calls until the server stops. (Calls that come
// after, while connections drain, get goroutines of their own.)
func (s *Server) work() {
	for {
		select {
		case k := <-s.calls:
			k.run()
		case <-s.quit:
			return
		}
	}
}

// New returns a server with no methods.
func New(opts Options) *Server {
	opts.fill()
	s := &Server{opts: opts, methods: map[string]*method{}, listeners: map[net.Listener]struct{}{}, conns: map[*conn]struct{}{}}
	s.connsDone = sync.NewCond(&s.mu)
	s.now = time.Now
	s.quit = make(chan struct{})
	return s
}

// Handle serves method, a full method name such as
// "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", with h.
// It must be called before Serve.
func (s *Server) Handle(name string, h Handler) { s.methods[name] = &method{unary: h} }

// Call is one call of a batch (see BatchHandler).
type Call struct {
	Ctx  context.Context // the call's own: its grpc-timeout, ended by a RST_STREAM
	Req  []byte          // the request message, valid while the handler runs
	Resp []byte          // the response message: the handler appends it to the empty Resp it gets (no copy then), or sets it...
	Err  error           // ...or an error, sent as a gRPC status
	// Headers are the request headers Options.KeepHeaders names, in the
	// order they came; nil when it names none.
	Headers []Header
}

// Header is one request header field.
type Header struct{ Name, Value string }

// BatchHandler answers calls of one method that arrived together on one
// connection: the requests the server had read when it would next have
// waited for the network (at most MaxBatch). It runs on the connection's
// reader, which reads nothing more until it returns: the calls that arrive
// meanwhile wait in the socket and form the next batch. A batch lets the
// handler share work between calls (one Redis round trip for all, in the
// control plane) and costs no handoff between goroutines. A handler that
// may block should bound how long (the control plane's store calls have a
// deadline). It must set every call's Resp or Err. ctx ends with the
// connection.
type BatchHandler func(ctx context.Context, calls []Call)

// MaxBatch bounds the calls of one batch.
const MaxBatch = 128

// HandleBatch serves method name with h, calls in batches. It must be called
// before Serve.
func (s *Server) HandleBatch(name string, h BatchHandler) { s.methods[name] = &method{batch: h} }

// Serve accepts connections on ln until ln fails or the server stops; it
// closes ln. After GracefulStop or Stop it returns ErrServerStopped.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		ln.Close()
		return ErrServerStopped
	}
	s.listeners[ln] = struct{}{}
	s.mu.Unlock()
	s.sweepOnce.Do(func() { go s.sweeper() })
	defer func() {
		s.mu.Lock()
		delete(s.listeners, ln)
		s.mu.Unlock()
		ln.Close()
	}()
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			stopping := s.stopping
			s.mu.Unlock()
			if stopping {
				return ErrServerStopped
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				// Out of file descriptors and the like: wait, as net/http does.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		s.mu.Lock()
		if s.stopping {
			s.mu.Unlock()
			nc.Close()
			return ErrServerStopped
		}
		var victim *conn
		if len(s.conns)-s.closing >= s.opts.MaxConns {
			if victim = s.idlestLocked(s.now()); victim == nil || s.closing >= s.opts.MaxConns {
				s.mu.Unlock()
				s.refused.Add(1)
				refuseConn(nc)
				continue
			}
			victim.evicted = true
			s.closing++
		}
		c := newConn(s, nc)
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		if victim != nil {
			s.evicted.Add(1)
			victim.evict()
		}
		go c.serve()
	}
}

// forget removes an ended connection.
func (s *Server) forget(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	if c.evicted {
		s.closing--
	}
	s.connsDone.Broadcast()
	s.mu.Unlock()
}

// stopListening closes the listeners and marks the server stopping; it
// returns the connections open now.
func (s *Server) stopListening() []*conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopping = true
	s.quitOnce.Do(func() { close(s.quit) })
	for ln := range s.listeners {
		ln.Close()
	}
	cs := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		cs = append(cs, c)
	}
	return cs
}

// GracefulStop stops accepting connections and calls, sends every
// connection a GOAWAY naming the last call it will answer, waits for those
// calls to be answered, and closes the connections (after giving each
// client up to a second to close its side first). Calls the client sends
// after the GOAWAY are refused (REFUSED_STREAM), which gRPC clients retry
// elsewhere.
func (s *Server) GracefulStop() {
	for _, c := range s.stopListening() {
		c.drain()
	}
	s.waitConns()
}

// Stop closes the listeners and every connection at once, cancelling the
// calls in progress.
func (s *Server) Stop() {
	for _, c := range s.stopListening() {
		c.close()
	}
	s.waitConns()
}

// waitConns returns once every connection has ended.
func (s *Server) waitConns() {
	s.mu.Lock()
	for len(s.conns) > 0 {
		s.connsDone.Wait()
	}
	s.mu.Unlock()
}
