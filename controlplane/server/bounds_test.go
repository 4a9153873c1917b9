package server

import (
	"context"
	"net"
	"net/http"
	"strings"
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
			FirstCallTimeout: 10 * time.Second, BodyTimeout: 2 * time.Second,
		}},
		{"stream cap binds", Config{MaxStreamsPerConn: 8, MaxConns: 10, MaxBufferBytes: 800 << 10, IdleTimeout: time.Second}, Bounds{
			MaxConns: 10, StreamsPerConn: 8, SharedStreams: 10, IdleTimeout: time.Second, HandshakeTimeout: 10 * time.Second,
			MaxConnBufferBytes: 8 * 80 << 10, MaxBufferBytes: 20 * 80 << 10,
			FirstCallTimeout: time.Second, BodyTimeout: 2 * time.Second, // never past the idle timeout
		}},
		{"a budget below one stream still runs one", Config{MaxConnBufferBytes: 1, MaxBufferBytes: 1, MaxConns: 1, FirstCallTimeout: time.Minute, BodyTimeout: time.Millisecond}, Bounds{
			MaxConns: 1, StreamsPerConn: 1, SharedStreams: 0, IdleTimeout: 5 * time.Minute, HandshakeTimeout: 10 * time.Second,
			MaxConnBufferBytes: 80 << 10, MaxBufferBytes: 80 << 10,
			FirstCallTimeout: time.Minute, BodyTimeout: time.Millisecond,
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

// TestFairShare: a connection takes a shared stream while it holds fewer
// than are left free.
func TestFairShare(t *testing.T) {
	tests := []struct {
		free, held int64
		want       bool
	}{
		{1, 0, true},   // a connection holding nothing gets the last one
		{0, 0, false},  // none left
		{13, 12, true}, // 64 greedy connections of 819 streams settle at 12 or 13 each...
		{12, 12, false},
		{12, 0, true}, // ...and leave 12 for one that holds little
		{819, 818, true},
		{409, 410, false}, // one greedy connection alone takes about half
	}
	for _, tc := range tests {
		if got := fairShare(tc.free, tc.held); got != tc.want {
			t.Errorf("fairShare(free %d, held %d) = %v, want %v", tc.free, tc.held, got, tc.want)
		}
	}
}

// TestStreamBudget: each connection's first stream is always admitted, the
// others while the connection holds fewer shared slots than are free; a
// slot comes back when its stream's context ends, and the calls are marked
// on their connection. Before fairShare, connection A took every shared
// slot and B's second stream was refused.
func TestStreamBudget(t *testing.T) {
	b := newStreamBudget(4, 0)
	connA, connB := &connAddr{Addr: &net.TCPAddr{Port: 1}}, &connAddr{Addr: &net.TCPAddr{Port: 2}}
	stream := func(a net.Addr) (context.CancelFunc, error) {
		ctx, cancel := context.WithCancel(peer.NewContext(context.Background(), &peer.Peer{Addr: a}))
		_, err := b.admit(ctx, &tap.Info{})
		return cancel, err
	}
	var aStreams []context.CancelFunc
	for i := range 3 { // A's own, then shared while held < free: 0 < 4, 1 < 3
		end, err := stream(connA)
		if err != nil {
			t.Fatalf("A's stream %d: %v", i+1, err)
		}
		aStreams = append(aStreams, end)
	}
	if _, err := stream(connA); status.Code(err) != codes.ResourceExhausted { // 2 < 2: no
		t.Fatalf("A's fourth stream: %v, want ResourceExhausted", err)
	}
	if got := connA.inflight.Load(); got != 3 {
		t.Errorf("A has %d calls in flight, want 3", got)
	}
	for i := range 2 { // B's own, then one of the two A left free: 0 < 2
		if _, err := stream(connB); err != nil {
			t.Fatalf("B's stream %d, A holding its share: %v", i+1, err)
		}
	}
	if _, err := stream(connB); status.Code(err) != codes.ResourceExhausted { // 1 < 1: no
		t.Fatalf("B's third stream: %v, want ResourceExhausted", err)
	}
	aStreams[2]()
	waitUntil(t, "the shared slot back", 5*time.Second, func() bool { return b.free.Load() == 2 && connA.held.Load() == 1 })
	aStreams[0]()
	waitUntil(t, "A's own slot back", 5*time.Second, func() bool { return connA.guaranteed.Load() == 0 && connA.inflight.Load() == 1 })
	if connA.lastEnd.Load() == 0 {
		t.Error("A's ended calls not marked")
	}
	if got := b.refused.Load(); got != 2 {
		t.Errorf("refused %d, want 2", got)
	}
}

// TestBodyDeadline: an admitted call's context ends bodyTimeout after its
// headers unless the request arrives first.
func TestBodyDeadline(t *testing.T) {
	b := newStreamBudget(10, time.Millisecond)
	ctx, err := b.admit(peer.NewContext(context.Background(), &peer.Peer{Addr: &connAddr{Addr: &net.TCPAddr{Port: 1}}}), &tap.Info{})
	if err != nil {
		t.Fatal(err)
	}
	<-ctx.Done()
	if context.Cause(ctx) != errBodyTimeout {
		t.Errorf("cause %v, want errBodyTimeout", context.Cause(ctx))
	}

	b = newStreamBudget(10, time.Hour)
	ctx, _ = b.admit(peer.NewContext(context.Background(), &peer.Peer{Addr: &connAddr{Addr: &net.TCPAddr{Port: 2}}}), &tap.Info{})
	if _, err := requestArrived(ctx, nil, nil, func(context.Context, any) (any, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	if ctx.Value(bodyKey{}).(*time.Timer).Stop() {
		t.Error("the deadline still runs after the request arrived")
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

// TestHTTPBounds: the HTTP listener holds at most its cap of connections,
// making room for new ones by closing those that never sent a request, and
// refuses oversized headers.
func TestHTTPBounds(t *testing.T) {
	srv := start(t, Config{Policies: policies(t)})
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range httpMaxConns + 20 {
		c, err := net.Dial("tcp", srv.HTTPAddr())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	waitUntil(t, "20 connections evicted", 5*time.Second, func() bool {
		return counter(t, srv, `sluice_connections_evicted_total`, "http") >= 20
	})
	if open := srv.httpLn.(*limitListener).Open(); open > httpMaxConns {
		t.Errorf("%d connections open, cap %d", open, httpMaxConns)
	}
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	waitUntil(t, "connections closed", 5*time.Second, func() bool {
		return srv.httpLn.(*limitListener).Open() == 0
	})
	r, _ := http.NewRequest("GET", "http://"+srv.HTTPAddr()+"/healthz", nil)
	r.Header.Set("X-Big", strings.Repeat("x", 64<<10))
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("64 KiB header: %d, want 431", resp.StatusCode)
	}
	if code, _ := get(t, "http://"+srv.HTTPAddr()+"/healthz"); code != 200 {
		t.Errorf("/healthz after: %d", code)
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
