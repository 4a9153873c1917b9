package policystore

import (
	"io"
	"net"
	"sync"
	"testing"
)

// tcpProxy forwards 127.0.0.1 connections to a target, and can cut them:
// a client behind it loses Redis the way a network partition or a dead
// link would, while Redis itself keeps running for everyone else.
type tcpProxy struct {
	t      testing.TB
	ln     net.Listener
	target string

	mu    sync.Mutex
	cut   bool                  // new connections are refused
	conns map[net.Conn]struct{} // open connections, both sides
	wg    sync.WaitGroup        // the accept loop and the copiers
}

// startProxy listens on a free port and forwards to target until the test
// ends.
func startProxy(t testing.TB, target string) *tcpProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{t: t, ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		ln.Close()
		p.closeAll()
		p.wg.Wait()
	})
	return p
}

// Addr is the address clients dial.
func (p *tcpProxy) Addr() string { return p.ln.Addr().String() }

// accept forwards each accepted connection, or closes it while cut.
func (p *tcpProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		cut := p.cut
		p.mu.Unlock()
		if cut {
			c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.cut { // cut while dialling
			p.mu.Unlock()
			c.Close()
			up.Close()
			continue
		}
		p.conns[c], p.conns[up] = struct{}{}, struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(c, up)
		go p.pipe(up, c)
	}
}

// pipe copies from src to dst and closes both when either side ends.
func (p *tcpProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	io.Copy(dst, src)
	dst.Close()
	src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

// closeAll closes every open connection.
func (p *tcpProxy) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

// Cut closes every connection and refuses new ones until Restore.
func (p *tcpProxy) Cut() {
	p.mu.Lock()
	p.cut = true
	p.mu.Unlock()
	p.closeAll()
}

// Restore lets connections through again.
func (p *tcpProxy) Restore() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}
