package main

import (
	"bytes"
	be "encoding/binary"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/sluicehq/sluice/controlplane/internal/server"
)

// Attacks that make the decision port in grpc-go mode hold memory or
// goroutines, against
// the real binary on loopback. Each checks the process's RSS against a
// budget, that a normal ShouldRateLimit call from another connection
// succeeds during the attack and after it, and that goroutines return to
// their baseline.

// rawConn is an HTTP/2 client connection driven frame by frame.
type rawConn struct {
	nc     net.Conn
	fr     *http2.Framer
	hbuf   bytes.Buffer
	enc    *hpack.Encoder
	nextID uint32
}

// dialRaw opens a connection and sends the preface and SETTINGS.
func dialRaw(addr string) (*rawConn, error) {
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	c := &rawConn{nc: nc, nextID: 1}
	c.fr = http2.NewFramer(nc, nc)
	c.enc = hpack.NewEncoder(&c.hbuf)
	nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := nc.Write([]byte(http2.ClientPreface)); err != nil {
		nc.Close()
		return nil, err
	}
	if err := c.fr.WriteSettings(); err != nil {
		nc.Close()
		return nil, err
	}
	return c, nil
}

// openHalf opens a ShouldRateLimit stream whose request never ends: its
// HEADERS, then the start of a message that announces 16,000 bytes and
// sends 100.
func (c *rawConn) openHalf() error {
	id, err := c.startCall(5 * time.Second)
	if err != nil {
		return err
	}
	msg := make([]byte, 5+100)
	be.BigEndian.PutUint32(msg[1:5], 16000)
	return c.fr.WriteData(id, false, msg)
}

// startCall sends the HEADERS of a new ShouldRateLimit stream, within
// timeout, and returns its stream id.
func (c *rawConn) startCall(timeout time.Duration) (uint32, error) {
	return c.startCallTo("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", timeout)
}

// startCallTo sends the HEADERS of a new stream of the gRPC method path,
// within timeout, and returns its stream id.
func (c *rawConn) startCallTo(path string, timeout time.Duration) (uint32, error) {
	c.hbuf.Reset()
	for _, f := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":authority", "sluice"},
		{":path", path},
		{"content-type", "application/grpc"}, {"te", "trailers"},
	} {
		c.enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	id := c.nextID
	c.nextID += 2
	c.nc.SetWriteDeadline(time.Now().Add(timeout))
	return id, c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hbuf.Bytes(), EndHeaders: true})
}

// drain reads and discards what the server sends until the connection
// ends.
func (c *rawConn) drain() {
	go func() {
		buf := make([]byte, 32<<10)
		for {
			if _, err := c.nc.Read(buf); err != nil {
				return
			}
		}
	}()
}

// hostileServers are the decision-port servers the attacks run against.
// The unary server joins once it has the same bounds (its own helper
// bounds it); the goroutine budgets below are grpc-go's (three goroutines
// a connection, one a stream).
var hostileServers = []string{server.GRPCServerGo}

// forEachServer runs test against each of hostileServers.
func forEachServer(t *testing.T, test func(t *testing.T, mode string)) {
	for _, mode := range hostileServers {
		t.Run(mode, func(t *testing.T) { test(t, mode) })
	}
}

// hostile runs the binary with the decision server mode and args and
// returns it with its addresses.
func hostile(t *testing.T, mode string, args ...string) (p *proc, grpcAddr, httpAddr string) {
	t.Helper()
	p, rec := startBinary(t, nil, append([]string{"-grpc-server", mode, "-policy", writePolicy(t, binPolicy)}, args...)...)
	return p, rec["grpc"].(string), rec["http"].(string)
}

// sample is the server's state at one moment.
type sample struct {
	rss, peak  int64
	goroutines float64
}

func (s sample) String() string {
	return fmt.Sprintf("RSS %d MiB (peak %d MiB), %.0f goroutines", s.rss>>20, s.peak>>20, s.goroutines)
}

// measure samples the server.
func measure(t *testing.T, p *proc, httpAddr string) sample {
	t.Helper()
	st := procStatus(t, p.cmd.Process.Pid)
	return sample{rss: st["VmRSS"], peak: st["VmHWM"], goroutines: metric(t, httpAddr, "go_goroutines")}
}

// normalCall makes one ShouldRateLimit call on a connection of its own.
func normalCall(t *testing.T, grpcAddr, when string) {
	t.Helper()
	start := time.Now()
	if r := call(t, grpcAddr, "normal-"+when); r.OverallCode.String() == "" {
		t.Fatalf("%s: empty answer", when)
	}
	t.Logf("normal call %s the attack: OK in %v", when, time.Since(start).Round(time.Microsecond))
}

// waitBaseline waits until the server's goroutines are back within slack
// of base, and returns how long that took.
func waitBaseline(t *testing.T, p *proc, httpAddr string, base float64, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		s := measure(t, p, httpAddr)
		if s.goroutines <= base+10 {
			return time.Since(start)
		}
		if time.Since(start) > limit {
			t.Fatalf("goroutines %v, baseline %v: not back within %v", s.goroutines, base, limit)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestHostileHalfOpenStreams: 100 connections open 200 streams each that
// never finish their request (20,000 half-open streams). Before the
// bounds grpc-go ran a goroutine for each (50,000 made 612 MB); now a
// connection runs at most -max-streams-per-conn of them and the server
// -max-buffer-bytes' worth beyond each connection's first.
func TestHostileHalfOpenStreams(t *testing.T) { forEachServer(t, testHostileHalfOpenStreams) }

func testHostileHalfOpenStreams(t *testing.T, mode string) {
	p, grpcAddr, httpAddr := hostile(t, mode)
	normalCall(t, grpcAddr, "before")
	base := measure(t, p, httpAddr)
	t.Logf("baseline: %v", base)

	const conns, streams = 100, 200
	var attack []*rawConn
	defer func() {
		for _, c := range attack {
			c.nc.Close()
		}
	}()
	for range conns {
		c, err := dialRaw(grpcAddr)
		if err != nil {
			t.Fatal(err)
		}
		c.drain()
		attack = append(attack, c)
	}
	var wg sync.WaitGroup
	for _, c := range attack {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range streams {
				if c.openHalf() != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	time.Sleep(500 * time.Millisecond) // let the server take in what was sent
	during := measure(t, p, httpAddr)
	t.Logf("during %d half-open streams on %d connections: %v", conns*streams, conns, during)
	normalCall(t, grpcAddr, "during")

	// The grpc-go bounds: streams <= conns + 64 MiB / 128 KiB shared.
	const budgetRSS = 200 << 20
	if during.peak > budgetRSS {
		t.Errorf("peak RSS %d MiB over the budget %d MiB", during.peak>>20, budgetRSS>>20)
	}
	if maxG := base.goroutines + 3*conns + conns + 512 + 50; during.goroutines > maxG {
		t.Errorf("%v goroutines during the attack, want at most %v", during.goroutines, maxG)
	}
	for _, c := range attack {
		c.nc.Close()
	}
	attack = nil
	took := waitBaseline(t, p, httpAddr, base.goroutines, 10*time.Second)
	after := measure(t, p, httpAddr)
	t.Logf("after: goroutines back to baseline in %v; %v", took.Round(time.Millisecond), after)
	if after.peak > budgetRSS {
		t.Errorf("peak RSS %d MiB over the budget %d MiB", after.peak>>20, budgetRSS>>20)
	}
	normalCall(t, grpcAddr, "after")
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit %d", code)
	}
}

// TestHostileIdleConnections: connections that send the preface and then
// nothing. At most -max-conns stay open (each one past it takes the place
// of the oldest), and all are closed after -first-call-timeout, as they
// have made no call, although the client keeps them.
func TestHostileIdleConnections(t *testing.T) { forEachServer(t, testHostileIdleConnections) }

func testHostileIdleConnections(t *testing.T, mode string) {
	p, grpcAddr, httpAddr := hostile(t, mode, "-max-conns", "500", "-first-call-timeout", "6s")
	base := measure(t, p, httpAddr)
	t.Logf("baseline: %v", base)

	const idle = 450
	var attack []*rawConn
	defer func() {
		for _, c := range attack {
			c.nc.Close()
		}
	}()
	for range idle {
		c, err := dialRaw(grpcAddr)
		if err != nil {
			t.Fatal(err)
		}
		attack = append(attack, c)
	}
	time.Sleep(300 * time.Millisecond)
	during := measure(t, p, httpAddr)
	t.Logf("during %d idle connections: %v", idle, during)
	normalCall(t, grpcAddr, "during")
	if open := metric(t, httpAddr, `sluice_connections_open{listener="decision"}`); open < idle {
		t.Errorf("%v connections open, want >= %d", open, idle)
	}
	const budgetRSS = 150 << 20
	if during.peak > budgetRSS {
		t.Errorf("peak RSS %d MiB over the budget %d MiB", during.peak>>20, budgetRSS>>20)
	}

	// Over the cap: each connection past 500 takes the place of the
	// oldest idle one.
	var over []*rawConn
	for range 100 {
		if c, err := dialRaw(grpcAddr); err == nil {
			over = append(over, c)
		}
	}
	defer func() {
		for _, c := range over {
			c.nc.Close()
		}
	}()
	waitUntilMetric(t, httpAddr, `sluice_connections_evicted_total{listener="decision"}`, func(v float64) bool { return v >= 50 }, 5*time.Second)

	// The attacker keeps its sockets; the server closes them when idle.
	took := waitBaseline(t, p, httpAddr, base.goroutines, 20*time.Second)
	t.Logf("idle connections closed by the server: goroutines back to baseline in %v; %v", took.Round(time.Millisecond), measure(t, p, httpAddr))
	normalCall(t, grpcAddr, "after")
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit %d", code)
	}
}

// waitUntilMetric waits until the metric satisfies ok.
func waitUntilMetric(t *testing.T, httpAddr, name string, ok func(float64) bool, limit time.Duration) {
	t.Helper()
	start := time.Now()
	for {
		v := metric(t, httpAddr, name)
		if ok(v) {
			t.Logf("%s = %v", name, v)
			return
		}
		if time.Since(start) > limit {
			t.Fatalf("%s = %v after %v", name, v, limit)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestHostileNeverReads: a client sends complete ShouldRateLimit calls and
// PINGs as fast as it can and never reads its socket. The server's
// answers back up; its memory must not. grpc-go already stops reading such
// a client (this passed before the bounds too): the test keeps it so.
func TestHostileNeverReads(t *testing.T) { forEachServer(t, testHostileNeverReads) }

func testHostileNeverReads(t *testing.T, mode string) {
	p, grpcAddr, httpAddr := hostile(t, mode)
	base := measure(t, p, httpAddr)
	t.Logf("baseline: %v", base)

	c, err := dialRaw(grpcAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.nc.Close()
	stop := time.Now().Add(3 * time.Second)
	calls, pings := 0, 0
	var data [8]byte
	for time.Now().Before(stop) {
		id, err := c.startCall(200 * time.Millisecond)
		if err != nil {
			break // the server stopped reading us: what we want
		}
		if c.fr.WriteData(id, true, []byte{0, 0, 0, 0, 5, 0x0a, 0x03, 'b', 'i', 'n'}) != nil {
			break
		}
		calls++
		for range 10 {
			if c.fr.WritePing(false, data) != nil {
				break
			}
			pings++
		}
	}
	during := measure(t, p, httpAddr)
	t.Logf("during: %d calls and %d PINGs sent without reading: %v", calls, pings, during)
	normalCall(t, grpcAddr, "during")
	const budgetRSS = 150 << 20
	if during.peak > budgetRSS {
		t.Errorf("peak RSS %d MiB over the budget %d MiB", during.peak>>20, budgetRSS>>20)
	}
	c.nc.Close()
	took := waitBaseline(t, p, httpAddr, base.goroutines, 10*time.Second)
	t.Logf("after: goroutines back to baseline in %v; %v", took.Round(time.Millisecond), measure(t, p, httpAddr))
	normalCall(t, grpcAddr, "after")
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit %d", code)
	}
}
