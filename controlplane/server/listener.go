package server

import (
	"net"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// limitListener caps the connections open at once on a listener. A
// connection accepted over the cap is closed at once (the client sees the
// connection reset and may retry elsewhere) instead of waiting in the
// kernel's backlog, where it would hold a slot of the backlog and look
// served to its client.
//
// Each connection it returns reports a *connAddr as its RemoteAddr: the
// stream budget finds the connection's counters there (gRPC servers put the
// RemoteAddr in the peer of every call's context).
type limitListener struct {
	net.Listener
	max     int64
	open    atomic.Int64
	refused prometheus.Counter // nil: not counted
}

// newLimitListener caps ln at max open connections (max > 0).
func newLimitListener(ln net.Listener, max int, refused prometheus.Counter) *limitListener {
	return &limitListener{Listener: ln, max: int64(max), refused: refused}
}

// Accept returns the next connection under the cap, closing those over it.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) > l.max {
			l.open.Add(-1)
			c.Close()
			if l.refused != nil {
				l.refused.Inc()
			}
			continue
		}
		return &limitConn{Conn: c, l: l, addr: &connAddr{Addr: c.RemoteAddr()}}, nil
	}
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
	c.close.Do(func() { c.l.open.Add(-1) })
	return err
}

// RemoteAddr returns the peer's address, carrying the connection's
// counters.
func (c *limitConn) RemoteAddr() net.Addr { return c.addr }

// connAddr is a connection's remote address with the connection's
// counters: its String and Network are the address's.
type connAddr struct {
	net.Addr
	// guaranteed is 1 while the connection's guaranteed stream is in use
	// (see streamBudget).
	guaranteed atomic.Int32
}
