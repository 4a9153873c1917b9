package grpcunary

import (
	"errors"
	"time"

	"golang.org/x/net/http2"
)

// evictGrace is how long a connection closed to make room waits for its
// peer to close its side after the GOAWAY and FIN (closeGrace for the
// others): an idle peer that reads has the GOAWAY by then, and the
// connections still closing count against MaxConns.
const evictGrace = 100 * time.Millisecond

var errEvicted = errors.New("grpcunary: closed to make room for a new connection (idle longest)")

// idlestLocked returns the connection to close to make room for a new one
// at MaxConns: of those with no call in progress, not already ending, the
// one nearest its idle timeout, which is FirstCallTimeout after it opened
// for a connection that has completed no call, and IdleTimeout after it
// last opened a stream for the others. It returns nil if there is none.
// s.mu is held.
func (s *Server) idlestLocked(now time.Time) *conn {
	var v *conn
	var first time.Time
	for c := range s.conns {
		if c.evicted {
			continue
		}
		end, ok := c.idleEnd(now)
		if ok && (v == nil || end.Before(first)) {
			v, first = c, end
		}
	}
	return v
}

// idleEnd returns when the connection's idle timeout would close it, and
// false if it is not idle: a call in progress, or already ending.
func (c *conn) idleEnd(now time.Time) (time.Time, bool) {
	o := &c.srv.opts
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.fatal || c.draining {
		return time.Time{}, false
	}
	for _, st := range c.streams {
		if st.remoteDone.Load() {
			return time.Time{}, false // a complete request: its call is in progress
		}
	}
	switch {
	case c.answered == 0:
		return c.born.Add(o.FirstCallTimeout), true
	case c.opened != c.lastOpened:
		return now.Add(o.IdleTimeout), true // a stream opened since the last sweep
	}
	return c.idleSince.Add(o.IdleTimeout), true
}

// evict closes the connection to make room for a new one: GOAWAY NO_ERROR
// (the client may reconnect) and the end, without waiting for its
// unfinished requests.
func (c *conn) evict() {
	c.evicting.Store(true)
	c.goAway(http2.ErrCodeNo, errEvicted)
}
