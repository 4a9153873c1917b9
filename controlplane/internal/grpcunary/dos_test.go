package grpcunary

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"runtime"
	"runtime/metrics"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/controlplane/internal/connbounds"
	"github.com/sluicehq/sluice/internal/attackload"
)

// Attacks that deny the decision port to others: a few clients must not
// deny it to the others. Each test measures the share of normal calls that
// succeed during the attack, on fresh connections and on a connection
// opened before it.

// freshEcho makes one call on a connection of its own.
func freshEcho(addr string) error {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var out wrapperspb.BytesValue
	return cc.Invoke(ctx, "/test.Echo/Echo", wrapperspb.Bytes([]byte("fresh")), &out)
}

// normalLoad makes normal calls until done: parallel at a time on tb's
// connection (opened before the attack), and fresh ones, each on a
// connection of its own. It returns when the callers have stopped.
func normalLoad(tb *testbed, parallel, freshers int, done <-chan struct{}, old, fresh *attackload.Tally) {
	established := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := tb.echo(ctx, []byte("established"))
		return err
	}
	attackload.During(done,
		attackload.Load{Workers: parallel, Call: established, Tally: old},
		attackload.Load{Workers: freshers, Call: func() error { return freshEcho(tb.addr) }, Tally: fresh})
}

// holdBodies is the never-ending request attack: conns connections that
// each start streams whose request announces a 60 KiB message, send
// 16 KiB and one more byte of it (which makes the server hold 32 KiB),
// and never end them: first burst streams, then more every 100 ms, until
// until. The attackers read (and drop) what the server sends, so that
// nothing but the bodies is at stake.
func holdBodies(t *testing.T, addr string, conns, burst int, until time.Time) {
	block := neverIndexed(request("/test.Echo/Echo"))
	data := make([]byte, 16<<10)
	data[0] = 0
	binary.BigEndian.PutUint32(data[1:5], 60<<10)
	var wg sync.WaitGroup
	for range conns {
		a := dialAttacker(t, addr, false)
		a.buf = appendWindowUpdate(a.buf, 0, 1<<30)
		wg.Add(2)
		go func() {
			defer wg.Done()
			io.Copy(io.Discard, a.nc)
		}()
		go func() {
			defer wg.Done()
			defer a.nc.Close()
			id := uint32(1)
			for n := burst; time.Now().Before(until); n = 4 {
				for range n {
					a.buf = appendFrameHeader(a.buf, len(block), http2.FrameHeaders, http2.FlagHeadersEndHeaders, id)
					a.buf = append(a.buf, block...)
					a.buf = appendFrameHeader(a.buf, len(data), http2.FrameData, 0, id)
					a.buf = append(a.buf, data...)
					a.buf = appendFrameHeader(a.buf, 1, http2.FrameData, 0, id)
					a.buf = append(a.buf, 0)
					id += 2
					if !a.flush(until) {
						return
					}
				}
				time.Sleep(100 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
}

// TestAttackNeverEndingBodies: 64 connections that start requests and
// never end them took the whole server-wide buffer budget, and every other
// call, on new connections and on existing ones, was answered
// RESOURCE_EXHAUSTED until the attackers left (0 of 1,076 calls succeeded).
// Now a connection holding less than its fair share of the budget (or
// nothing) takes room from the connections holding more than theirs, whose
// unfinished requests are refused (RST_STREAM REFUSED_STREAM), and the
// heap stays within the budget.
func TestAttackNeverEndingBodies(t *testing.T) {
	const budget = 8 << 20
	tb := newTestbed(t, Options{Bounds: connbounds.Bounds{MaxConnBufferBytes: 1 << 20, MaxBufferBytes: budget}})
	if _, err := tb.echo(context.Background(), []byte("before")); err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	base := liveHeap()

	until := time.Now().Add(attackTime)
	attacked := make(chan struct{})
	go func() {
		defer close(attacked)
		holdBodies(t, tb.addr, 64, 40, until)
	}()
	// The budget fills within the first burst; the normal calls start
	// once it is full.
	for tb.srv.buffered.Load() < budget*3/4 && time.Now().Before(until) {
		time.Sleep(time.Millisecond)
	}
	held := tb.srv.buffered.Load()
	var peak atomic.Uint64
	done := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if h := liveHeap(); h > base {
				peak.Store(max(peak.Load(), h-base))
			}
			select {
			case <-done:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	var old, fresh attackload.Tally
	go func() {
		<-attacked
		close(done)
	}()
	normalLoad(tb, 4, 2, done, &old, &fresh)
	<-sampled
	t.Logf("the attackers held %.1f MiB of the %.0f MiB budget when the normal calls began; live heap growth %.1f MiB",
		mib(uint64(held)), mib(budget), mib(peak.Load()))
	old.Check(t, "a connection opened before the attack", 0.999, 20)
	fresh.Check(t, "fresh connections", 0.999, 10)
	// The bodies are within the budget; the rest is the connections'
	// (the server's and the attackers') and the normal calls'.
	if peak.Load() > 32<<20 {
		t.Errorf("the live heap grew by %.1f MiB, over 32 MiB", mib(peak.Load()))
	}
	for deadline := time.Now().Add(5 * time.Second); tb.srv.buffered.Load() != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the server still counts %d bytes of request buffers after the attack", tb.srv.buffered.Load())
		}
	}
}

// TestBodyTimeout: a request whose body is not complete
// BodyTimeout after its headers is reset (RST_STREAM CANCEL) and
// its buffer freed; before, it was held until the connection went idle.
// A request that ends in time is answered. The sweeps run on an injected
// clock: the first that sees a request unfinished starts its time.
func TestBodyTimeout(t *testing.T) {
	const timeout = 2 * time.Second
	tb := newTestbed(t, Options{Bounds: connbounds.Bounds{BodyTimeout: timeout}})
	c := dial(t, tb.addr)
	body := echoBody(t, make([]byte, 1000))
	c.headers(1, false, request("/test.Echo/Echo"))
	c.data(1, false, body[:500]) // never ended
	c.headers(3, false, request("/test.Echo/Echo"))
	c.data(3, false, body[:500]) // ended late, but in time
	c.pingPong()
	if n := tb.srv.buffered.Load(); n == 0 {
		t.Fatal("the server holds no request bytes")
	}
	now := time.Now()
	tb.srv.sweep(now)
	tb.srv.sweep(now.Add(timeout - time.Millisecond))
	c.data(3, true, body[500:])
	if a := c.readAnswer(3); a.status() != "0" {
		t.Fatalf("the request that ended in time: %v", a.status())
	}
	tb.srv.sweep(now.Add(timeout))
	c.expectRST(1, http2.ErrCodeCancel)
	if n := tb.srv.buffered.Load(); n != 0 {
		t.Errorf("the server still counts %d bytes of request buffers", n)
	}
	c.call(5, "/test.Echo/Echo", body)
	if a := c.readAnswer(5); a.status() != "0" {
		t.Fatalf("a call after the reset: %v", a.status())
	}
	if got := tb.srv.Stats().StreamsTimedOut; got != 1 {
		t.Errorf("Stats().StreamsTimedOut = %d, want 1", got)
	}
}

// liveHeap returns the heap that the last garbage collection found live
// (what the process holds, without the garbage not yet collected).
func liveHeap() uint64 {
	m := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(m)
	return m[0].Value.Uint64()
}

// idleAttack opens n connections that send the preface and SETTINGS and
// then nothing, each read (and dropped) until the server closes it; it
// returns the connections and a function that closes them and waits for
// their readers.
func idleAttack(t *testing.T, addr string, n int) (closed *atomic.Int64, stop func()) {
	closed = new(atomic.Int64)
	var stopping atomic.Bool
	var wg sync.WaitGroup
	var ncs []net.Conn
	for range n {
		a := dialAttacker(t, addr, false)
		a.flush(time.Now().Add(attackTime))
		ncs = append(ncs, a.nc)
		wg.Add(1)
		go func() {
			defer wg.Done()
			io.Copy(io.Discard, a.nc)
			if !stopping.Load() {
				closed.Add(1) // by the server: a FIN, or a reset
			}
		}()
	}
	return closed, func() {
		stopping.Store(true)
		for _, nc := range ncs {
			nc.Close()
		}
		wg.Wait()
	}
}

// TestAttackIdleConnectionsAtCap: 2,000 connections that do nothing
// held every one of the MaxConns slots, and every new client was refused
// (0 of 198 calls succeeded) until the idle timeout. Now a new connection
// at the cap closes (GOAWAY, then close) the connection nearest its idle
// timeout, and connections that have completed no call have a much
// shorter one (FirstCallTimeout): the attackers' go first, and the
// connection in use stays.
func TestAttackIdleConnectionsAtCap(t *testing.T) {
	const maxConns, attackers = 256, 2000
	attackload.RaiseOpenFiles(t, 3*attackers)
	tb := newTestbed(t, Options{Bounds: connbounds.Bounds{MaxConns: maxConns}})
	if _, err := tb.echo(context.Background(), []byte("before")); err != nil {
		t.Fatal(err)
	}
	closed, stop := idleAttack(t, tb.addr, attackers)
	defer stop()
	// The attack's burst of connects is over once the server has closed the
	// attackers it evicted: until then (evictGrace each, longer on a busy
	// machine) MaxConns of them may still be closing, and a new connection
	// is refused, as in TestAttackConnectionFlood. What is measured here is
	// the idle connections that stay.
	for deadline := time.Now().Add(attackTime); (closed.Load() < attackers-maxConns || tb.srv.closingConns() > 0) && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond) // the accept loop's work
	}
	done := make(chan struct{})
	time.AfterFunc(attackTime, func() { close(done) })
	var old, fresh attackload.Tally
	normalLoad(tb, 1, 4, done, &old, &fresh)
	st := tb.srv.Stats()
	t.Logf("%d attackers' connections closed by the server; %d evicted, %d refused, %d open", closed.Load(), st.ConnsEvicted, st.ConnsRefused, len(tb.srv.openConns()))
	fresh.Check(t, "new clients", 0.99, 10)
	old.Check(t, "a connection opened before the attack", 0.999, 20)
	if n := len(tb.srv.openConns()); n > maxConns+int(st.ConnsEvicted) {
		t.Errorf("%d connections open, over the cap of %d", n, maxConns)
	}
}

// TestFirstCallTimeout: a connection that has completed no call is closed
// (GOAWAY NO_ERROR) FirstCallTimeout after it opened, while one that has
// completed a call stays until IdleTimeout. Before, both stayed for the
// IdleTimeout.
func TestFirstCallTimeout(t *testing.T) {
	const first, idle = 10 * time.Second, 5 * time.Minute
	tb := newTestbed(t, Options{Bounds: connbounds.Bounds{FirstCallTimeout: first, IdleTimeout: idle}})
	unused := dial(t, tb.addr)
	used := dial(t, tb.addr)
	used.call(1, "/test.Echo/Echo", echoBody(t, []byte("x")))
	used.readAnswer(1)
	now := time.Now()
	tb.srv.sweep(now)
	tb.srv.sweep(now.Add(first + time.Second))
	unused.expectGoAway(http2.ErrCodeNo)
	used.pingPong() // still open
	used.call(3, "/test.Echo/Echo", echoBody(t, []byte("y")))
	if a := used.readAnswer(3); a.status() != "0" {
		t.Fatalf("the used connection: %v", a.status())
	}
}

// TestIdlest: at MaxConns, the connection closed to make room is the one
// whose idle timeout comes first: FirstCallTimeout after it opened for one
// that has completed no call, IdleTimeout after its last new stream for
// the others; never one with a call in progress or already ending.
func TestIdlest(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	type spec struct {
		born     time.Duration // after t0
		answered uint64
		idle     time.Duration // idleSince, after t0
		calling  bool          // a complete request in progress
		ending   bool
	}
	for _, tc := range []struct {
		name  string
		conns []spec
		want  int // index, -1: none
	}{
		{"unused, oldest first", []spec{{born: 2 * time.Second}, {born: time.Second}, {born: 3 * time.Second}}, 1},
		{"unused before used", []spec{{answered: 5, idle: 0}, {born: time.Minute}}, 1},
		{"used nearly at its idle timeout before a new unused one", []spec{{answered: 5, idle: 0}, {born: 4*time.Minute + 55*time.Second}}, 0},
		{"used, idle longest", []spec{{answered: 1, idle: 3 * time.Second}, {answered: 9, idle: time.Second}}, 1},
		{"not one in a call", []spec{{calling: true}, {born: time.Second}}, 1},
		{"not one ending", []spec{{ending: true}, {answered: 1}}, 1},
		{"none", []spec{{calling: true}, {ending: true}}, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := New(Options{Bounds: connbounds.Bounds{FirstCallTimeout: 10 * time.Second, IdleTimeout: 5 * time.Minute}})
			var cs []*conn
			for _, sp := range tc.conns {
				nc, peer := net.Pipe()
				defer nc.Close()
				defer peer.Close()
				c := newConn(s, nc)
				c.born, c.answered, c.idleSince, c.fatal = t0.Add(sp.born), sp.answered, t0.Add(sp.idle), sp.ending
				if sp.calling {
					st := &stream{id: 1}
					st.remoteDone.Store(true)
					c.streams[1] = st
				}
				s.conns[c] = struct{}{}
				cs = append(cs, c)
			}
			s.mu.Lock()
			got := s.idlestLocked(t0.Add(5 * time.Minute))
			s.mu.Unlock()
			want := (*conn)(nil)
			if tc.want >= 0 {
				want = cs[tc.want]
			}
			if got != want {
				t.Errorf("idlest is connection %d, want %d", slices.Index(cs, got), tc.want)
			}
		})
	}
}
