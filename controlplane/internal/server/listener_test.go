package server

import (
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// TestEvictee: at the cap the connection without calls in flight that is
// due to close soonest goes: one that never completed a call firstCall
// after it was accepted, others idle after their last call.
func TestEvictee(t *testing.T) {
	const idle, firstCall = 300 * time.Second, 10 * time.Second
	t0 := time.Unix(1000, 0)
	conn := func(accepted time.Time, lastEnd time.Duration, inflight int32) *limitConn {
		a := &connAddr{accepted: accepted.UnixNano()}
		if lastEnd != 0 {
			a.lastEnd.Store(accepted.Add(lastEnd).UnixNano())
		}
		a.inflight.Store(inflight)
		return &limitConn{addr: a}
	}
	busyOld := conn(t0, 0, 1)                          // never idle: kept
	servedLong := conn(t0, time.Second, 0)             // due at t0+301s
	fresh := conn(t0.Add(200*time.Second), 0, 0)       // never called: due at t0+210s
	freshest := conn(t0.Add(250*time.Second), 0, 0)    // due at t0+260s
	servedIdle := conn(t0.Add(-100*time.Second), 1, 0) // idle since t0-99s: due at t0+201s
	closing := conn(t0, time.Second, 0)                // its server closes it: due at once...
	closing.addr.evictFirst.Store(evictAfterGrace)
	inGrace := conn(t0.Add(260*time.Second), time.Millisecond, 0) // ...once its answer has had time to go
	inGrace.addr.evictFirst.Store(evictAfterGrace)
	refusedNow := conn(t0.Add(260*time.Second), time.Millisecond, 0)
	refusedNow.addr.evictFirst.Store(evictNow)
	tests := []struct {
		name  string
		conns []*limitConn
		want  *limitConn
	}{
		{"all busy", []*limitConn{busyOld}, nil},
		{"never called goes before a recent caller", []*limitConn{busyOld, servedLong, fresh, freshest}, fresh},
		{"the oldest never-called first", []*limitConn{freshest, fresh}, fresh},
		{"a caller idle nearly its whole timeout goes first", []*limitConn{fresh, servedIdle, servedLong}, servedIdle},
		{"one being closed goes first", []*limitConn{fresh, servedIdle, closing}, closing},
		{"not before its answer is out", []*limitConn{busyOld, inGrace}, nil},
		{"unless the answer was a refusal", []*limitConn{busyOld, inGrace, refusedNow}, refusedNow},
	}
	for _, tc := range tests {
		set := map[*limitConn]struct{}{}
		for _, c := range tc.conns {
			set[c] = struct{}{}
		}
		if got := evictee(set, idle, firstCall, t0.Add(260*time.Second)); got != tc.want {
			t.Errorf("%s: evicted %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestLimitListenerEvicts: at the cap the listener closes an idle
// connection to take the new one, and refuses the new one when every
// connection has a call in flight; the sweep closes connections that
// completed no call within firstCall.
func TestLimitListenerEvicts(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused, evicted := prometheus.NewCounter(prometheus.CounterOpts{Name: "r"}), prometheus.NewCounter(prometheus.CounterOpts{Name: "e"})
	l := newLimitListener(ln, 2, refused)
	var clock atomic.Int64 // the injected clock, read by Accept's goroutine
	clock.Store(time.Unix(1000, 0).UnixNano())
	l.now = func() time.Time { return time.Unix(0, clock.Load()) }
	now := l.now()
	l.evictAtCap(time.Minute, 10*time.Second, evicted)
	defer l.Close()

	accepted := make(chan *limitConn, 10)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- c.(*limitConn)
		}
	}()
	var clients []net.Conn
	dial := func() net.Conn {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
		return c
	}
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	closed := func(c net.Conn) bool {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := c.Read(make([]byte, 1))
		return err != nil && !isTimeout(err)
	}

	first := dial()
	<-accepted
	dial()
	b := <-accepted
	b.addr.begin() // b has a call in flight
	now = now.Add(time.Second)
	clock.Store(now.UnixNano())
	dial() // at the cap: a, idle, goes
	c := <-accepted
	if !closed(first) {
		t.Fatal("the idle connection was not evicted")
	}
	if got := value(evicted); got != 1 {
		t.Errorf("evicted %v, want 1", got)
	}
	c.addr.begin()
	refusedClient := dial() // b and c busy: refused
	if !closed(refusedClient) {
		t.Fatal("the connection over the cap, all busy, was not closed")
	}
	if got := value(refused); got != 1 {
		t.Errorf("refused %v, want 1", got)
	}

	// The sweep leaves connections that completed a call to their server.
	c.addr.end(now)
	l.sweep(now.Add(time.Hour))
	if l.Open() != 2 {
		t.Errorf("%d open after a sweep, want 2: connections that completed a call are the server's to close", l.Open())
	}
	b.addr.end(now)
	dial() // evicts b or c (idle alike); the new one has completed no call
	<-accepted
	l.sweep(now.Add(10*time.Second - 1))
	if l.Open() != 2 {
		t.Errorf("%d open, want 2 before the first-call timeout", l.Open())
	}
	l.sweep(now.Add(10 * time.Second))
	if l.Open() != 1 {
		t.Errorf("%d open, want 1 after the first-call timeout", l.Open())
	}
}

// isTimeout reports whether err is a timeout.
func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// value returns a counter's value.
func value(c prometheus.Counter) float64 {
	var m dto.Metric
	c.Write(&m)
	return m.GetCounter().GetValue()
}
