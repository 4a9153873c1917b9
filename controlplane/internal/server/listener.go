package server

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// limitListener caps the connections open at once on a listener. At the
// cap, an evicting listener (see evictAtCap) closes the open connection
// that is due to close soonest for want of calls and takes the new one; a
// listener that does not evict, or that finds every connection busy,
// closes the new connection at once (the client sees the connection reset
// and may retry elsewhere) instead of leaving it in the kernel's backlog,
// where it would hold a slot of the backlog and look served to its client.
//
// Each connection it returns reports a *connAddr as its RemoteAddr: the
// stream budget and the activity marks (connAddr.begin, end) find the
// connection's counters there (gRPC servers put the RemoteAddr in the peer
// of every call's context; the HTTP server hands the connection to
// ConnContext).
type limitListener struct {
	net.Listener
	max     int64
	open    atomic.Int64
	refused prometheus.Counter // nil: not counted
	evicted prometheus.Counter // nil: not counted

	// idle and firstCall are the idle timeouts of a connection that has
	// completed a call and of one that has not; evict says whether the
	// cap evicts (see evictAtCap).
	evict           bool
	idle, firstCall time.Duration
	now             func() time.Time

	mu    sync.Mutex
	conns map[*limitConn]struct{} // open connections, when evicting
	done  chan struct{}           // closed by Close: ends the sweeper
	close sync.Once
}

// newLimitListener caps ln at max open connections (max > 0), refusing
// new connections at the cap.
func newLimitListener(ln net.Listener, max int, refused prometheus.Counter) *limitListener {
	return &limitListener{Listener: ln, max: int64(max), refused: refused, now: time.Now, done: make(chan struct{})}
}

// evictAtCap makes l evict at the cap, and close a connection that has
// completed no call firstCall after it was accepted (the sweeper, every
// quarter of firstCall and at least every second). idle is when a
// connection's server closes it after its last call, which orders the
// eviction; the server closes those itself.
func (l *limitListener) evictAtCap(idle, firstCall time.Duration, evicted prometheus.Counter) {
	l.evict, l.idle, l.firstCall, l.evicted = true, idle, firstCall, evicted
	l.conns = make(map[*limitConn]struct{})
	every := min(firstCall/4, time.Second)
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-l.done:
				return
			case <-t.C:
				l.sweep(l.now())
			}
		}
	}()
}

// Accept returns the next connection under the cap, making room or
// closing the new one at the cap.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) > l.max && !l.makeRoom() {
			l.open.Add(-1)
			if l.refused != nil {
				l.refused.Inc() // before the close, which the client may see at once
			}
			c.Close()
			continue
		}
		now := l.now()
		lc := &limitConn{Conn: c, l: l, addr: &connAddr{Addr: c.RemoteAddr(), accepted: now.UnixNano()}}
		if l.evict {
			l.mu.Lock()
			l.conns[lc] = struct{}{}
			l.mu.Unlock()
		}
		return lc, nil
	}
}

// makeRoom closes the connection evictable soonest (see evictee), and
// reports whether there was one.
func (l *limitListener) makeRoom() bool {
	if !l.evict {
		return false
	}
	l.mu.Lock()
	victim := evictee(l.conns, l.idle, l.firstCall, l.now())
	l.mu.Unlock()
	if victim == nil {
		return false
	}
	if l.evicted != nil {
		l.evicted.Inc() // before the close, which the client may see at once
	}
	victim.Close()
	return true
}

// evictee returns the connection without calls in flight that is due to
// close soonest (connAddr.idleUntil), or nil when every connection has a
// call in flight. A connection that never completed a call is due
// firstCall after it was accepted, others idle after their last call:
// with firstCall much shorter than idle, connections that hold a slot and
// make no calls go first, in the order they came, and a client that makes
// calls keeps its connection unless it has been idle nearly as long as
// its server would allow anyway.
func evictee(conns map[*limitConn]struct{}, idle, firstCall time.Duration, now time.Time) *limitConn {
	var victim *limitConn
	var soonest int64
	for c := range conns {
		due, ok := c.addr.idleUntil(idle, firstCall, now)
		if ok && (victim == nil || due < soonest) {
			victim, soonest = c, due
		}
	}
	return victim
}

// sweep closes the connections that have completed no call firstCall
// after they were accepted and have none in flight.
func (l *limitListener) sweep(now time.Time) {
	var late []*limitConn
	l.mu.Lock()
	for c := range l.conns {
		if c.addr.lastEnd.Load() == 0 && c.addr.inflight.Load() == 0 && now.UnixNano()-c.addr.accepted >= int64(l.firstCall) {
			late = append(late, c)
		}
	}
	l.mu.Unlock()
	for _, c := range late {
		c.Close()
	}
}

// Close closes the listener and stops the sweeper.
func (l *limitListener) Close() error {
	l.close.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// Open returns the connections open now.
func (l *limitListener) Open() int { return int(l.open.Load()) }

// limitConn gives its slot back when closed.
type limitConn struct {
	net.Conn
	l     *limitListener
	addr  *connAddr
	close sync.Once
}

// Close closes the connection and frees its slot (once).
func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.close.Do(func() {
		if c.l.evict {
			c.l.mu.Lock()
			delete(c.l.conns, c)
			c.l.mu.Unlock()
		}
		c.l.open.Add(-1)
	})
	return err
}

// RemoteAddr returns the peer's address, carrying the connection's
// counters.
func (c *limitConn) RemoteAddr() net.Addr { return c.addr }

// connAddr is a connection's remote address with the connection's
// counters: its String and Network are the address's.
type connAddr struct {
	net.Addr
	// accepted is when the listener accepted the connection (Unix ns).
	accepted int64
	// guaranteed is 1 while the connection's guaranteed stream is in use,
	// held counts the shared streams it holds, and pending those of its
	// calls whose request has yet to arrive (see streamBudget; pending
	// under its lock).
	guaranteed atomic.Int32
	held       atomic.Int64
	pending    map[*call]struct{}
	// inflight counts the calls in progress, and lastEnd is when the last
	// one ended (Unix ns; 0: none has).
	inflight atomic.Int32
	lastEnd  atomic.Int64
	// evictFirst puts the connection first in line at the cap, once its
	// last answer has had evictGrace to get out (evictAfterGrace: an HTTP
	// answer being written, or a connection net/http is closing) or at
	// once (evictNow: a refused request).
	evictFirst atomic.Int32
	// tapped counts the streams that reached the server's tap handle: the
	// frame guard compares it with the header blocks it read.
	tapped atomic.Uint64
}

// begin marks a call in progress on the connection.
func (a *connAddr) begin() { a.inflight.Add(1) }

// end marks the end of a call begun, at now.
func (a *connAddr) end(now time.Time) {
	a.lastEnd.Store(now.UnixNano())
	a.inflight.Add(-1)
}

// evictGrace is how long an HTTP connection whose answer is being written
// stays after its handler ended before it may be evicted: an answer that
// has not got out by then goes to a client that does not read it (net/http
// also keeps a connection it closes for half a second after the answer).
const evictGrace = 250 * time.Millisecond

// Values of connAddr.evictFirst.
const (
	evictAfterGrace = 1
	evictNow        = 2
)

// idleUntil returns when the connection is due to close for want of calls
// (Unix ns): idle after its last call ended, or firstCall after it was
// accepted if no call has ended, or at once when evictFirst says so; ok
// is false while a call is in flight or within evictGrace.
func (a *connAddr) idleUntil(idle, firstCall time.Duration, now time.Time) (due int64, ok bool) {
	if a.inflight.Load() > 0 {
		return 0, false
	}
	last := a.lastEnd.Load()
	switch a.evictFirst.Load() {
	case evictNow:
		return 0, true
	case evictAfterGrace:
		return last, now.UnixNano()-last >= int64(evictGrace)
	}
	if last != 0 {
		return last + int64(idle), true
	}
	return a.accepted + int64(firstCall), true
}
