package server

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// TestGRPCBounds: how the flags become grpc-go's limits.
func TestGRPCBounds(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want Bounds
	}{
		{"defaults", Config{}, Bounds{
			MaxConns: 1024, StreamsPerConn: 51, SharedStreams: 819, IdleTimeout: 5 * time.Minute, HandshakeTimeout: 10 * time.Second,
			MaxConnBufferBytes: 51 * 80 << 10, MaxBufferBytes: (819 + 1024) * 80 << 10,
		}},
		{"stream cap binds", Config{MaxStreamsPerConn: 8, MaxConns: 10, MaxBufferBytes: 800 << 10, IdleTimeout: time.Second}, Bounds{
			MaxConns: 10, StreamsPerConn: 8, SharedStreams: 10, IdleTimeout: time.Second, HandshakeTimeout: 10 * time.Second,
			MaxConnBufferBytes: 8 * 80 << 10, MaxBufferBytes: 20 * 80 << 10,
		}},
		{"a budget below one stream still runs one", Config{MaxConnBufferBytes: 1, MaxBufferBytes: 1, MaxConns: 1}, Bounds{
			MaxConns: 1, StreamsPerConn: 1, SharedStreams: 0, IdleTimeout: 5 * time.Minute, HandshakeTimeout: 10 * time.Second,
			MaxConnBufferBytes: 80 << 10, MaxBufferBytes: 80 << 10,
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := grpcBounds(tc.cfg); got != tc.want {
				t.Errorf("grpcBounds = %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// TestStreamBudget: each connection's first stream is always admitted,
// the others while shared slots last; a slot comes back when its stream's
// context ends.
func TestStreamBudget(t *testing.T) {
	b := newStreamBudget(1)
	connA, connB := &connAddr{Addr: &net.TCPAddr{Port: 1}}, &connAddr{Addr: &net.TCPAddr{Port: 2}}
	stream := func(a net.Addr) (context.CancelFunc, error) {
		ctx, cancel := context.WithCancel(peer.NewContext(context.Background(), &peer.Peer{Addr: a}))
		_, err := b.admit(ctx, &tap.Info{})
		return cancel, err
	}
	a1, err := stream(connA) // A's own
	if err != nil {
		t.Fatal(err)
	}
	a2, err := stream(connA) // the shared slot
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream(connA); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("third stream of A: %v, want ResourceExhausted", err)
	}
	if _, err := stream(connB); err != nil {
		t.Fatalf("B's first stream, shared slots spent: %v", err)
	}
	a2()
	waitUntil(t, "the shared slot back", 5*time.Second, func() bool { return b.free.Load() == 1 })
	a1()
	waitUntil(t, "A's own slot back", 5*time.Second, func() bool { return connA.guaranteed.Load() == 0 })
	if got := b.refused.Load(); got != 1 {
		t.Errorf("refused %d, want 1", got)
	}
}

// TestStreamBudgetOverGRPC: with no shared streams, a connection that
// holds its own stream (a call whose request never ends) gets
// RESOURCE_EXHAUSTED for a second call and survives; another connection
// is served.
func TestStreamBudgetOverGRPC(t *testing.T) {
	srv := start(t, Config{Policies: policies(t), GRPCServer: GRPCServerGo, MaxBufferBytes: 1})
	connA := dial(t, srv.GRPCAddr())
	held, err := connA.NewStream(context.Background(), &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, shouldRateLimitMethod)
	if err != nil {
		t.Fatal(err)
	}
	defer held.CloseSend()
	// The held stream is open once its headers are in: wait for the
	// server to count it.
	waitUntil(t, "the held stream admitted", 5*time.Second, func() bool {
		_, err := rlsv3.NewRateLimitServiceClient(connA).ShouldRateLimit(context.Background(), req("x"))
		return status.Code(err) == codes.ResourceExhausted && strings.Contains(err.Error(), "-max-buffer-bytes")
	})
	connB := dial(t, srv.GRPCAddr())
	if r := ask(t, rlsv3.NewRateLimitServiceClient(connB), "b"); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("another connection: %v", r)
	}
	held.CloseSend()
	_ = held.RecvMsg(new(rlsv3.RateLimitResponse))
	// A survived and is served again once its stream ended.
	waitUntil(t, "A served again", 5*time.Second, func() bool {
		_, err := rlsv3.NewRateLimitServiceClient(connA).ShouldRateLimit(context.Background(), req("a"))
		return err == nil
	})
}

// req is a ShouldRateLimit request for user.
func req(user string) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "srv", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: user}}}}}
}

// TestHTTPBounds: the HTTP listener, and an extra one (envoyproxy/ratelimit's
// health and debug ports), close connections over their cap at once, and
// refuse oversized headers.
func TestHTTPBounds(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	srv := start(t, Config{Policies: policies(t), ExtraHTTP: []HTTPEndpoint{{Name: "healthcheck", Addr: "127.0.0.1:0", Handler: ok}}})
	testHTTPBounds(t, srv, "http", srv.HTTPAddr(), srv.httpLn.(*limitListener), "/healthz")
	testHTTPBounds(t, srv, "healthcheck", srv.ExtraHTTPAddr("healthcheck"), srv.extra[0].ln.(*limitListener), "/")
}

func testHTTPBounds(t *testing.T, srv *Server, name, addr string, ln *limitListener, path string) {
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range httpMaxConns + 20 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	var refused atomic.Int64
	waitUntil(t, name+": 20 connections refused", 5*time.Second, func() bool {
		refused.Store(int64(counter(t, srv, `sluice_connections_refused_total`, name)))
		return refused.Load() >= 20
	})
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	waitUntil(t, name+": connections closed", 5*time.Second, func() bool {
		return ln.Open() == 0
	})
	r, _ := http.NewRequest("GET", "http://"+addr+path, nil)
	r.Header.Set("X-Big", strings.Repeat("x", 64<<10))
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("%s: 64 KiB header: %d, want 431", name, resp.StatusCode)
	}
	if code, _ := get(t, "http://"+addr+path); code != 200 {
		t.Errorf("%s: %s after: %d", name, path, code)
	}
}

// counter returns a listener's metric from the registry.
func counter(t *testing.T, srv *Server, name, listener string) float64 {
	t.Helper()
	mfs, err := srv.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "listener" && l.GetValue() == listener {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s{listener=%q}", name, listener)
	return 0
}
