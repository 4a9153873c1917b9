package grpcunary

import (
	"encoding/binary"
	"errors"
	"strconv"
	"time"

	"golang.org/x/net/http2"
)

// The request buffer budgets (RATIONALE.md, "Bounds" and "Fair shares").
//
// A request's buffer is charged to its connection (conn.buffered, at most
// MaxConnBufferBytes) and to the server (Server.buffered, at most
// MaxBufferBytes). It is the reader's until the request is complete and
// handed over to its call (handOver), then the call's until the answer
// (release). Two other goroutines may free the reader's part: the sweeper,
// for a request not complete BodyTimeout after its headers, and
// another connection's reader, which sheds a connection holding more than
// its fair share when it needs room. conn.bmu guards the reader's part.

// maxSheds bounds the times one charge sheds a connection (or finds that
// another connection shed it first) before it gives up.
const maxSheds = 8

// charge takes n bytes of request buffer from the connection's budget and
// the server's, or reports which is full. When the server's is full and the
// connection holds nothing, or no more than its fair share
// (fairShareLocked) with n, room is taken from the connection
// holding the most unfinished requests beyond its share: those requests are
// refused (shed). A connection past its share waits (is refused) instead.
func (c *conn) charge(n int64) error {
	s := c.srv
	o := &s.opts
	held := c.buffered.Load()
	if held+n > o.MaxConnBufferBytes {
		return errConnBudget
	}
	for range maxSheds + 1 {
		if s.buffered.Add(n) <= o.MaxBufferBytes {
			c.buffered.Add(n)
			return nil
		}
		s.buffered.Add(-n)
		s.mu.Lock()
		share := s.fairShareLocked()
		var v *conn
		if held == 0 || held+n <= share {
			v = s.overShareLocked(c, share)
		}
		s.mu.Unlock()
		if v == nil {
			return errSrvBudget
		}
		// What v frees goes to c first: the others, which may be
		// waiting for room too, get the rest.
		freed := v.shed(share)
		if freed >= n {
			s.buffered.Add(n - freed)
			c.buffered.Add(n)
			return nil
		}
		// Too little, or another connection shed v first: again.
		s.buffered.Add(-freed)
	}
	return errSrvBudget
}

// fairShareLocked returns a connection's fair share of the server's
// budget: MaxBufferBytes over the open connections and one more. The
// shares of all add up to less than the budget, so that when it is full
// some connection holds more than its share. s.mu is held.
func (s *Server) fairShareLocked() int64 {
	return s.opts.MaxBufferBytes / int64(len(s.conns)+1)
}

// overShareLocked returns the connection other than c that holds more than
// share bytes and the most of them in unfinished requests, or nil. s.mu is
// held.
func (s *Server) overShareLocked(c *conn, share int64) *conn {
	var v *conn
	var most int64
	for o := range s.conns {
		if o == c || o.buffered.Load() <= share {
			continue
		}
		if h := o.held.Load(); h > most {
			v, most = o, h
		}
	}
	return v
}

// shed refuses the connection's unfinished requests (RST_STREAM
// REFUSED_STREAM: the client may retry them) until it holds no more than
// share, and returns the bytes freed, which are still charged to the
// server: the caller returns them.
func (c *conn) shed(share int64) int64 {
	var freed, n int64
	c.bmu.Lock()
	if !c.bufDone {
		c.mu.Lock()
		for id, st := range c.streams {
			if c.buffered.Load() <= share {
				break
			}
			if st.dispatched || st.charged == 0 || st.remoteDone.Load() {
				continue
			}
			freed += c.expireLocked(id, st, http2.ErrCodeRefusedStream)
			n++
		}
		c.mu.Unlock()
	}
	c.bmu.Unlock()
	if n > 0 {
		c.srv.shed.Add(uint64(n))
		c.signal()
		c.closeIfDrained()
	}
	return freed
}

// expireBodies resets (RST_STREAM CANCEL) the requests that the sweeps
// have seen unfinished for BodyTimeout, and frees their buffers.
// The first sweep that sees a request unfinished starts its time.
func (c *conn) expireBodies(now time.Time) {
	var n uint64
	var freed int64
	c.bmu.Lock()
	if !c.bufDone {
		c.mu.Lock()
		for id, st := range c.streams {
			if st.dispatched || st.remoteDone.Load() {
				continue
			}
			if st.unfinishedSince.IsZero() {
				st.unfinishedSince = now
				continue
			}
			if now.Sub(st.unfinishedSince) >= c.srv.opts.BodyTimeout {
				freed += c.expireLocked(id, st, http2.ErrCodeCancel)
				n++
			}
		}
		c.mu.Unlock()
	}
	c.bmu.Unlock()
	if n > 0 {
		c.srv.timedOut.Add(n)
		c.srv.buffered.Add(-freed)
		c.signal()
		c.closeIfDrained()
	}
}

// expireLocked resets stream id, an unfinished request the reader still
// owns, with code, and frees its buffer; it returns the bytes freed, which
// the caller returns to the server's budget. The reader drops what still
// comes for it. c.bmu and c.mu are held.
func (c *conn) expireLocked(id uint32, st *stream, code http2.ErrCode) int64 {
	c.takeStreamLocked(id)
	c.resetLocked(id, code)
	n := st.charged
	st.charged, st.expired = 0, true
	c.held.Add(-n)
	c.buffered.Add(-n)
	return n
}

// uncharge returns n bytes to both budgets.
func (c *conn) uncharge(n int64) {
	if n != 0 {
		c.buffered.Add(-n)
		c.srv.buffered.Add(-n)
	}
}

// buffer appends data to st's request body, within the budgets, which are
// charged what the body allocates. A body that comes in one frame is
// allocated once; one that comes in pieces grows to at most twice what came,
// and never past what its message prefix announces. A prefix announcing
// more than MaxMsgBytes fails at once. The data of a request reset
// meanwhile (expired) is dropped.
func (c *conn) buffer(st *stream, data []byte) error {
	need := len(st.body) + len(data)
	if need > cap(st.body) {
		size := need
		if need >= 5 {
			var p [5]byte
			copy(p[copy(p[:], st.body):], data)
			announced := 5 + int(binary.BigEndian.Uint32(p[1:]))
			if announced > c.srv.opts.MaxMsgBytes+5 {
				return errTooLarge
			}
			// At most twice what came, so that a prefix that lies costs
			// its sender half of what it reserves.
			size = max(size, min(announced, 2*cap(st.body)))
		}
		if size > c.srv.opts.MaxMsgBytes+5 {
			return errTooLarge
		}
		grow := int64(size - cap(st.body))
		if err := c.charge(grow); err != nil {
			return err
		}
		c.bmu.Lock()
		expired := st.expired
		if !expired {
			st.charged += grow
			c.held.Add(grow)
		}
		c.bmu.Unlock()
		if expired {
			c.uncharge(grow)
			return nil
		}
		body := make([]byte, len(st.body), size)
		copy(body, st.body)
		st.body = body
	}
	st.body = append(st.body, data...)
	return nil
}

var errTooLarge = errors.New("too large")

// refusal is the RESOURCE_EXHAUSTED message for buffer's error.
func (c *conn) refusal(err error) string {
	o := &c.srv.opts
	switch err {
	case errConnBudget:
		return "grpcunary: " + err.Error() + " (" + strconv.FormatInt(o.MaxConnBufferBytes, 10) + " bytes): retry later"
	case errSrvBudget:
		return "grpcunary: " + err.Error() + " (" + strconv.FormatInt(o.MaxBufferBytes, 10) + " bytes): retry later"
	}
	return "grpcunary: request larger than " + strconv.Itoa(o.MaxMsgBytes) + " bytes"
}

// drop releases the request buffer of a stream the reader still owns (not
// handed over to run).
func (c *conn) drop(st *stream) {
	st.body = nil
	c.bmu.Lock()
	if !st.dispatched && st.charged != 0 {
		c.held.Add(-st.charged)
		c.uncharge(st.charged)
		st.charged = 0
	}
	c.bmu.Unlock()
}

// handOver passes st's request buffer to its call (a batch, or a unary
// call's worker), which releases it (release) once the call is answered.
// It reports false for a request reset meanwhile (expired), whose call
// must not run.
func (c *conn) handOver(st *stream) bool {
	c.bmu.Lock()
	defer c.bmu.Unlock()
	if st.expired {
		return false
	}
	st.dispatched = true
	c.held.Add(-st.charged)
	return true
}

// releaseHeld frees what the reader still holds when the connection ends;
// nothing can be charged to the reader after it.
func (c *conn) releaseHeld() {
	c.bmu.Lock()
	c.bufDone = true
	c.uncharge(c.held.Swap(0))
	c.bmu.Unlock()
}

// release returns the request buffers of calls that ran.
func (c *conn) release(sts ...*stream) {
	var n int64
	for _, st := range sts {
		n += st.charged
		st.charged = 0
	}
	c.uncharge(n)
}
