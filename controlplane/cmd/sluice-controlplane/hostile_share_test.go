package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	sluicev1 "github.com/sluicehq/sluice/controlplane/api/sluice/v1"
	"github.com/sluicehq/sluice/controlplane/internal/server"
)

// Attacks that deny a listener to others, against the real binary on
// loopback: each runs normal calls from other clients during the attack
// and asserts the share of them that succeeded (and, for the health probes, their latency),
// which is what an attack on a rate limiter takes away. The policy and
// HTTP listeners are the same in both decision-server modes, and are
// attacked in both; the decision port's attacks here are grpc-go mode's
// (the unary server's have their own file).

// allServers are the decision-server modes.
var allServers = []string{server.GRPCServerUnary, server.GRPCServerGo}

// shareToken is the policy service's token in these tests.
const shareToken = "test-token-0123456789abcdef"

// addrPattern matches the loopback addresses in errors.
var addrPattern = regexp.MustCompile(`127\.0\.0\.1:\d+`)

// load runs normal calls on workers until stopped, and counts them.
type load struct {
	ok, failed atomic.Int64
	mu         sync.Mutex
	errs       map[string]int
	lat        []time.Duration
	stop       chan struct{}
	wg         sync.WaitGroup
}

// startLoad runs call on workers goroutines until finish.
func startLoad(workers int, call func(worker int) error) *load {
	l := &load{errs: map[string]int{}, stop: make(chan struct{})}
	for w := range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				start := time.Now()
				err := call(w)
				d := time.Since(start)
				l.mu.Lock()
				l.lat = append(l.lat, d)
				if err != nil {
					l.failed.Add(1)
					// Errors alike but for their addresses count as one.
					msg := addrPattern.ReplaceAllString(err.Error(), "ADDR")
					if len(l.errs) < 5 || l.errs[msg] > 0 {
						l.errs[msg]++
					}
				} else {
					l.ok.Add(1)
				}
				l.mu.Unlock()
			}
		}()
	}
	return l
}

// finish stops the load and returns the share of calls that succeeded.
func (l *load) finish(t *testing.T, what string) float64 {
	t.Helper()
	close(l.stop)
	l.wg.Wait()
	ok, failed := l.ok.Load(), l.failed.Load()
	if ok+failed == 0 {
		t.Fatalf("%s: no call completed", what)
	}
	share := float64(ok) / float64(ok+failed)
	t.Logf("%s: %d of %d calls succeeded (%.2f%%), p99 %v; errors %v", what, ok, ok+failed, 100*share, l.p99().Round(time.Millisecond), l.errs)
	return share
}

// p99 returns the 99th percentile of the calls' latency.
func (l *load) p99() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := slices.Clone(l.lat)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	if len(s) == 0 {
		return 0
	}
	return s[len(s)*99/100]
}

// decide makes one ShouldRateLimit call on cc.
func decide(cc *grpc.ClientConn, user string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
		Domain:      "bin",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: user}}}},
	})
	return err
}

// newClient returns a gRPC client of addr that connects at once.
func newClient(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	cc.Connect()
	return cc
}

// freshDecide makes calls ShouldRateLimit calls at once on a new
// connection, as an Envoy that just connected multiplexes them, and
// returns the first error.
func freshDecide(addr string, calls int) error {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	errc := make(chan error, calls)
	for i := range calls {
		go func() { errc <- decide(cc, fmt.Sprint("fresh-", i)) }()
	}
	var first error
	for range calls {
		if err := <-errc; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// policyList makes one authenticated List call on a new connection to the
// policy service, as `ratectl list` does.
func policyList(addr string) error {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+shareToken)
	_, err = sluicev1.NewPolicyServiceClient(cc).List(ctx, &sluicev1.ListRequest{})
	return err
}

// shareBinary runs the binary in mode with the policy service on, and
// returns it with its addresses.
func shareBinary(t *testing.T, mode string, args ...string) (p *proc, grpcAddr, httpAddr, policyAddr string) {
	t.Helper()
	p, rec := startBinary(t, []string{"SLUICE_TOKEN=" + shareToken},
		append([]string{"-grpc-server", mode, "-policy", writePolicy(t, binPolicy)}, args...)...)
	return p, rec["grpc"].(string), rec["http"].(string), rec["policy"].(string)
}

// TestHostileGreedyStreams (grpc-go mode): 64
// connections each keep as many streams open as the server lets them,
// with requests that never end. Normal calls, 8 at a time on a connection
// opened before the attack and 4 at a time on fresh connections (Envoy
// multiplexes), must succeed >= 99.9% of the time. Before fair shares the
// attackers took the whole shared budget and every call beyond a
// connection's first was refused.
func TestHostileGreedyStreams(t *testing.T) {
	p, grpcAddr, httpAddr, _ := shareBinary(t, server.GRPCServerGo)
	before := newClient(t, grpcAddr)
	defer before.Close()
	if err := decide(before, "warm"); err != nil {
		t.Fatal(err)
	}

	stop := make(chan struct{})
	var attackers sync.WaitGroup
	var opened atomic.Int64
	for range 64 {
		c, err := dialRaw(grpcAddr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.nc.Close()
		attackers.Add(1)
		go func() { defer attackers.Done(); greedy(c, 32, stop, &opened) }()
	}
	// Let the attackers take what they can.
	waitUntilMetric(t, httpAddr, "sluice_streams_refused_total", func(v float64) bool { return v > 0 }, 10*time.Second)

	existing := startLoad(8, func(w int) error { return decide(before, fmt.Sprint("existing-", w)) })
	fresh := startLoad(2, func(int) error { return freshDecide(grpcAddr, 4) })
	time.Sleep(3 * time.Second)
	shareExisting := existing.finish(t, "8 at a time on a connection opened before the attack")
	shareFresh := fresh.finish(t, "4 at a time on fresh connections")
	close(stop)
	attackers.Wait()
	t.Logf("attackers opened %d streams; %v refused, %v preempted, %v reset for want of their request; %s", opened.Load(),
		metric(t, httpAddr, "sluice_streams_refused_total"), metric(t, httpAddr, "sluice_streams_preempted_total"),
		metric(t, httpAddr, "sluice_streams_body_timeouts_total"), measure(t, p, httpAddr))

	if late := metric(t, httpAddr, "sluice_streams_body_timeouts_total"); late == 0 {
		t.Error("no request that never ends was reset after -request-body-timeout")
	}
	if shareExisting < 0.999 || shareFresh < 0.999 {
		t.Errorf("normal calls succeeded %.2f%% (existing connection) and %.2f%% (fresh ones) of the time, want >= 99.9%%", 100*shareExisting, 100*shareFresh)
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit %d", code)
	}
}

// greedy keeps up to max streams with requests that never end open on c,
// opening another whenever the server ends one, until stop. A stream
// refused at once is opened again 20 ms later (not in a busy loop, which
// would measure the machine's CPU rather than the server's budget).
func greedy(c *rawConn, max int, stop <-chan struct{}, opened *atomic.Int64) {
	ended := make(chan uint32, 1024)
	go func() {
		fr := http2.NewFramer(nil, c.nc)
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				close(ended)
				return
			}
			switch f := f.(type) {
			case *http2.RSTStreamFrame:
				ended <- f.StreamID
			case *http2.HeadersFrame:
				if f.StreamEnded() {
					ended <- f.StreamID
				}
			}
		}
	}()
	open := map[uint32]time.Time{}
	for {
		for len(open) < max {
			id := c.nextID
			if c.openHalf() != nil {
				return
			}
			open[id] = time.Now()
			opened.Add(1)
		}
		select {
		case <-stop:
			return
		case id, ok := <-ended:
			if !ok {
				return
			}
			if at, ok := open[id]; ok {
				delete(open, id)
				if time.Since(at) < 100*time.Millisecond {
					time.Sleep(20 * time.Millisecond)
				}
			}
		}
	}
}

// idleFlood keeps n connections that sent the preface and SETTINGS and
// nothing else open to addr until stop: it opens them all, then opens
// again those the server closes, at most perSecond a second in all (an
// attacker holding what it can, not a flood of new connections, which is
// bounded by how fast the server accepts). It returns once all are open.
func idleFlood(t *testing.T, addr string, n, perSecond int, stop <-chan struct{}, wg *sync.WaitGroup) {
	t.Helper()
	pace := time.NewTicker(time.Second / time.Duration(perSecond))
	ready := make(chan struct{}, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			first := true
			for {
				c, err := dialRaw(addr)
				if first {
					ready <- struct{}{}
					first = false
				}
				if err == nil {
					closed := make(chan struct{})
					go func() { io.Copy(io.Discard, c.nc); close(closed) }()
					select {
					case <-stop:
						c.nc.Close()
						return
					case <-closed:
						c.nc.Close()
					}
				}
				select {
				case <-stop:
					return
				case <-pace.C:
				}
			}
		}()
	}
	for range n {
		<-ready
	}
	go func() { <-stop; pace.Stop() }()
}

// TestHostileIdleConnections2000: 2,000 idle
// connections on the decision port (grpc-go mode) and on the policy
// service, kept open as far as the server lets them. New clients' calls
// must succeed >= 99% of the time on the attacked listener, and the other
// listener must not notice. Before eviction every new connection over the
// cap was refused until the idle timeout (5 minutes).
func TestHostileIdleConnections2000(t *testing.T) {
	for _, mode := range allServers {
		t.Run(mode, func(t *testing.T) {
			p, grpcAddr, httpAddr, policyAddr := shareBinary(t, mode)
			targets := []struct {
				name, addr string
				call       func() error
			}{
				{"policy service", policyAddr, func() error { return policyList(policyAddr) }},
			}
			if mode == server.GRPCServerGo { // the unary server's decision port has its own tests
				targets = append(targets, struct {
					name, addr string
					call       func() error
				}{"decision port", grpcAddr, func() error { return freshDecide(grpcAddr, 1) }})
			}
			for _, target := range targets {
				stop := make(chan struct{})
				var wg sync.WaitGroup
				idleFlood(t, target.addr, 2000, 200, stop, &wg)
				attacked := startLoad(2, func(int) error { return target.call() })
				var other *load
				if target.addr == policyAddr {
					other = startLoad(1, func(int) error { return freshDecide(grpcAddr, 1) })
				} else {
					other = startLoad(1, func(int) error { return policyList(policyAddr) })
				}
				time.Sleep(3 * time.Second)
				share := attacked.finish(t, "new clients of the "+target.name)
				otherShare := other.finish(t, "new clients of the other listener")
				close(stop)
				wg.Wait()
				t.Logf("%s: %s", target.name, measure(t, p, httpAddr))
				if share < 0.99 || otherShare < 0.99 {
					t.Errorf("%s under 2,000 idle connections: %.2f%% of new clients' calls succeeded, %.2f%% on the other listener; want >= 99%%",
						target.name, 100*share, 100*otherShare)
				}
			}
			if code := p.stop(t); code != 0 {
				t.Fatalf("exit %d", code)
			}
		})
	}
}

// TestHostileSlowReaders: 64 clients ask for /metrics
// and never read, again and again. /healthz and /readyz, each probe on a
// new connection as a kubelet's (100 a second: the probes of a thousand
// kubelets), must answer within 1 s (p99) >= 99% of the time. Before, the slow readers held every connection for the 30 s
// write timeout and the probes were refused.
func TestHostileSlowReaders(t *testing.T) {
	for _, mode := range allServers {
		t.Run(mode, func(t *testing.T) {
			p, _, httpAddr, _ := shareBinary(t, mode)
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for range 64 {
				wg.Add(1)
				go func() { defer wg.Done(); slowReader(httpAddr, stop) }()
			}
			time.Sleep(500 * time.Millisecond) // let them fill the slots
			hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
			probes := startLoad(2, func(w int) error {
				time.Sleep(20 * time.Millisecond) // 100 probes a second: a kubelet sends one every 10 s
				path := []string{"/healthz", "/readyz"}[w]
				resp, err := hc.Get("http://" + httpAddr + path)
				if err != nil {
					return err
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					return fmt.Errorf("%s: %s", path, resp.Status)
				}
				return nil
			})
			time.Sleep(3 * time.Second)
			share := probes.finish(t, "/healthz and /readyz probes")
			p99 := probes.p99()

			close(stop)
			wg.Wait()
			if share < 0.99 || p99 >= time.Second {
				t.Errorf("probes during the attack: %.2f%% answered, p99 %v; want >= 99%% within 1 s", 100*share, p99)
			}
			if code := p.stop(t); code != 0 {
				t.Fatalf("exit %d", code)
			}
		})
	}
}

// slowReader asks for /metrics on a connection whose receive buffer is
// small and never reads; it asks again every 200 ms (pipelined), and
// reconnects when the server closes the connection, until stop.
func slowReader(addr string, stop <-chan struct{}) {
	for {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
				continue
			}
		}
		nc.(*net.TCPConn).SetReadBuffer(4 << 10)
		for {
			nc.SetWriteDeadline(time.Now().Add(time.Second))
			if _, err := io.WriteString(nc, "GET /metrics HTTP/1.1\r\nHost: sluice\r\n\r\n"); err != nil {
				break
			}
			select {
			case <-stop:
				nc.Close()
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
		nc.Close()
	}
}

// TestHostileFloods (grpc-go mode): floods that grpc-go
// answers frame by frame and never ended: each must end its connection
// within 5 s, while normal calls on another connection keep succeeding.
func TestHostileFloods(t *testing.T) {
	p, grpcAddr, httpAddr, _ := shareBinary(t, server.GRPCServerGo)
	normal := newClient(t, grpcAddr)
	defer normal.Close()
	floods := []struct {
		name string
		send func(c *rawConn) error // one round of the flood
	}{
		{"rapid reset", rapidReset("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")},
		{"empty CONTINUATION", emptyContinuation},
		{"SETTINGS", func(c *rawConn) error {
			c.nc.SetWriteDeadline(time.Now().Add(time.Second))
			return c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 65535})
		}},
		{"bad HEADERS", func(c *rawConn) error {
			c.hbuf.Reset()
			for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/x"}, {"Bad-Name", "x"}} {
				c.enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
			}
			id := c.nextID
			c.nextID += 2
			c.nc.SetWriteDeadline(time.Now().Add(time.Second))
			return c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hbuf.Bytes(), EndHeaders: true, EndStream: true})
		}},
	}
	for _, flood := range floods {
		calls := startLoad(2, func(w int) error { return decide(normal, fmt.Sprint("flood-", w)) })
		how, frames, closedAfter := floodUntilClosed(t, grpcAddr, flood.send)
		time.Sleep(time.Second) // normal calls for a second at least
		share := calls.finish(t, flood.name+": normal calls on another connection")
		if how == "" {
			t.Errorf("%s: connection still open after %d frames in 5 s", flood.name, frames)
		} else {
			t.Logf("%s: %s after %d frames, %v", flood.name, how, frames, closedAfter.Round(time.Millisecond))
		}
		if share < 0.999 {
			t.Errorf("%s: %.2f%% of normal calls succeeded, want >= 99.9%%", flood.name, 100*share)
		}
	}
	if v := metric(t, httpAddr, `sluice_connections_calmed_total{listener="decision"}`); v < float64(len(floods)) {
		t.Errorf("sluice_connections_calmed_total %v, want %d", v, len(floods))
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit %d", code)
	}
}

// floodUntilClosed sends send's frames on a new connection to addr for up
// to 5 s, and returns how the connection ended ("" if it did not), the
// frames sent and when it ended.
func floodUntilClosed(t *testing.T, addr string, send func(*rawConn) error) (how string, frames int, after time.Duration) {
	t.Helper()
	c, err := dialRaw(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.nc.Close()
	ended := make(chan string, 1)
	go func() {
		fr := http2.NewFramer(nil, c.nc)
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				ended <- fmt.Sprintf("closed (%v)", err)
				return
			}
			if g, ok := f.(*http2.GoAwayFrame); ok && g.ErrCode == http2.ErrCodeEnhanceYourCalm {
				ended <- fmt.Sprintf("GOAWAY ENHANCE_YOUR_CALM %q", g.DebugData())
				return
			}
		}
	}()
	start := time.Now()
	deadline := start.Add(5 * time.Second)
	for time.Now().Before(deadline) && send(c) == nil {
		frames++
	}
	select {
	case how = <-ended:
	case <-time.After(time.Until(deadline.Add(time.Second))):
	}
	return how, frames, time.Since(start)
}

// rapidReset is one round of the rapid reset flood on the gRPC method
// path: a stream opened and reset at once.
func rapidReset(path string) func(*rawConn) error {
	return func(c *rawConn) error {
		id, err := c.startCallTo(path, time.Second)
		if err != nil {
			return err
		}
		return c.fr.WriteRSTStream(id, http2.ErrCodeCancel)
	}
}

// emptyContinuation is one round of the CONTINUATION flood: a header block
// that never ends, one empty CONTINUATION frame at a time.
func emptyContinuation(c *rawConn) error {
	if c.nextID == 1 {
		c.nextID = 3
		c.nc.SetWriteDeadline(time.Now().Add(time.Second))
		return c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte{0x82}})
	}
	return c.fr.WriteContinuation(1, false, nil)
}
