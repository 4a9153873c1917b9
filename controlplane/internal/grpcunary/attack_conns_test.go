package grpcunary

import (
	"context"
	"errors"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/sluicehq/sluice/controlplane/internal/connbounds"
)

// The connection attacks (see attack_test.go's runAttack):
// more connections than MaxConns, and connections that do nothing.

// openConns returns the server's connections.
func (s *Server) openConns() []*conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	cs := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		cs = append(cs, c)
	}
	return cs
}

// closingConns returns how many connections closed to make room have not
// ended yet (each waits up to evictGrace for its peer to hang up).
func (s *Server) closingConns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closing
}

// TestAttackConnectionFlood: there was no cap on connections. Now a
// connection beyond MaxConns makes room by closing the idlest (GOAWAY
// NO_ERROR), or, when MaxConns of those are still closing, is sent GOAWAY
// ENHANCE_YOUR_CALM and closed at once: every attempt but MaxConns is
// turned away with a GOAWAY, and at most MaxConns connections are open
// beside those closing.
func TestAttackConnectionFlood(t *testing.T) {
	const maxConns, attempts = 20, 300
	tb := newTestbed(t, Options{Bounds: connbounds.Bounds{MaxConns: maxConns}})
	var refused, most int
	runAttack(t, tb, 32<<20, func() {
		var as []*attacker
		for range attempts {
			a := dialAttacker(t, tb.addr, false)
			a.flush(time.Now().Add(attackTime))
			as = append(as, a)
		}
		until := time.Now().Add(attackTime)
		var turned atomic.Int32
		var wg sync.WaitGroup
		for _, a := range as {
			wg.Add(1)
			go func() { // until its GOAWAY, or the end of the attack
				defer wg.Done()
				a.nc.SetReadDeadline(until)
				fr := http2.NewFramer(nil, a.nc)
				for {
					f, err := fr.ReadFrame()
					if err != nil {
						return
					}
					if _, ok := f.(*http2.GoAwayFrame); ok {
						turned.Add(1) // refused, or accepted and then closed to make room
						return
					}
				}
			}()
		}
		wg.Wait()
		refused = int(turned.Load())
		most = len(tb.srv.openConns()) // every attempt has had its answer
		for _, a := range as {
			a.nc.Close()
		}
	})
	st := tb.srv.Stats()
	t.Logf("%d connections attempted, %d turned away (%d refused, %d evicted), at most %d open", attempts, refused, st.ConnsRefused, st.ConnsEvicted, most)
	if most > 2*maxConns || refused < attempts-maxConns {
		t.Errorf("at most %d connections open and %d turned away; want at most %d open and %d turned away", most, refused, 2*maxConns, attempts-maxConns)
	}
}

// TestAttackIdleConnections: connections that complete the handshake and
// then do nothing were never closed (5,000 of them took 118 MB), nor were
// those that hold a request that never ends. Now both are closed once they
// have opened no stream for IdleTimeout (the stalled requests are cut 2 s
// after the GOAWAY), and those that never send their SETTINGS after
// HandshakeTimeout. The sweeps run on an injected clock.
func TestAttackIdleConnections(t *testing.T) {
	tb := newTestbed(t, Options{})
	kinds := []struct {
		name   string
		n      int
		send   func(a *attacker)
		closed atomic.Int32
	}{
		{name: "idle", n: 300, send: func(a *attacker) {}},
		{name: "without SETTINGS", n: 100, send: func(a *attacker) { a.buf = append(a.buf, clientPreface...) }},
		{name: "with a request that never ends", n: 100, send: func(a *attacker) {
			block := neverIndexed(request("/test.Echo/Echo"))
			a.buf = appendFrameHeader(a.buf, len(block), http2.FrameHeaders, http2.FlagHeadersEndHeaders, 1)
			a.buf = append(a.buf, block...)
			a.buf = appendFrameHeader(a.buf, 5, http2.FrameData, 0, 1)
			a.buf = append(a.buf, 0, 0, 0, 1, 0)
		}},
	}
	// The budget is the connections' own memory: about 44 KB each on the
	// server's side, and as much again on the test's.
	runAttack(t, tb, 48<<20, func() {
		var wg sync.WaitGroup
		until := time.Now().Add(attackTime)
		total := 0
		for i := range kinds {
			k := &kinds[i]
			for range k.n {
				a := dialAttacker(t, tb.addr, k.name == "without SETTINGS")
				k.send(a)
				a.flush(until)
				wg.Add(1)
				go func() {
					defer wg.Done()
					a.nc.SetReadDeadline(until)
					_, err := io.CopyBuffer(io.Discard, a.nc, make([]byte, 512))
					if !errors.Is(err, os.ErrDeadlineExceeded) {
						k.closed.Add(1) // by the server: a FIN, or a reset
					}
					a.nc.Close()
				}()
			}
			total += k.n
		}
		for len(tb.srv.openConns()) < total+1 || tb.srv.openStreams() < kinds[2].n {
			time.Sleep(time.Millisecond) // the accept loop's and the readers' work
		}
		now := time.Now()
		tb.srv.sweep(now.Add(connbounds.Default.HandshakeTimeout))
		// The normal connection is in use, so not idle: the clock jumps,
		// and it must have opened a stream between the sweeps.
		if _, err := tb.echo(context.Background(), []byte("between")); err != nil {
			t.Error(err)
		}
		tb.srv.sweep(now.Add(connbounds.Default.HandshakeTimeout + connbounds.Default.IdleTimeout))
		tb.srv.sweep(now.Add(connbounds.Default.HandshakeTimeout + connbounds.Default.IdleTimeout + 3*closeGrace))
		wg.Wait()
	})
	for i := range kinds {
		k := &kinds[i]
		t.Logf("closed: %d of %d connections %s", k.closed.Load(), k.n, k.name)
		if int(k.closed.Load()) != k.n {
			t.Errorf("not every connection %s was closed", k.name)
		}
	}
}

// openStreams returns how many streams the server's connections have open.
func (s *Server) openStreams() int {
	n := 0
	for _, c := range s.openConns() {
		c.mu.Lock()
		n += len(c.streams)
		c.mu.Unlock()
	}
	return n
}
