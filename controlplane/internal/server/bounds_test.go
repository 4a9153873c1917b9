package server

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"reflect"
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

	"github.com/sluicehq/sluice/controlplane/internal/connbounds"
	"github.com/sluicehq/sluice/controlplane/internal/grpcunary"
)

// TestGRPCBounds: how the flags become grpc-go's limits. A stream holds its
// 64 KiB window and a message being assembled.
func TestGRPCBounds(t *testing.T) {
	const k = 1 << 10
	tests := []struct {
		name string
		cfg  Config
		want GRPCBounds
	}{
		{"defaults: 128 KiB streams", Config{}, GRPCBounds{
			MaxConns: 1024, StreamsPerConn: 32, SharedStreams: 512, MaxMsgBytes: 64 * k, MaxHeaderBytes: 16 * k,
			IdleTimeout: 5 * time.Minute, HandshakeTimeout: 10 * time.Second,
			MaxConnBufferBytes: 32 * 128 * k, MaxBufferBytes: (512 + 1024) * 128 * k,
			FirstCallTimeout: 10 * time.Second, BodyTimeout: 2 * time.Second,
		}},
		{"16 KiB messages: 80 KiB streams", Config{Bounds: connbounds.Bounds{MaxMsgBytes: 16 * k}}, GRPCBounds{
			MaxConns: 1024, StreamsPerConn: 51, SharedStreams: 819, MaxMsgBytes: 16 * k, MaxHeaderBytes: 16 * k,
			IdleTimeout: 5 * time.Minute, HandshakeTimeout: 10 * time.Second,
			MaxConnBufferBytes: 51 * 80 * k, MaxBufferBytes: (819 + 1024) * 80 * k,
			FirstCallTimeout: 10 * time.Second, BodyTimeout: 2 * time.Second,
		}},
		{"stream cap binds", Config{Bounds: connbounds.Bounds{MaxStreamsPerConn: 8, MaxConns: 10, MaxBufferBytes: 10 * 128 * k, IdleTimeout: time.Second}}, GRPCBounds{
			MaxConns: 10, StreamsPerConn: 8, SharedStreams: 10, MaxMsgBytes: 64 * k, MaxHeaderBytes: 16 * k,
			IdleTimeout: time.Second, HandshakeTimeout: 10 * time.Second,
			MaxConnBufferBytes: 8 * 128 * k, MaxBufferBytes: 20 * 128 * k,
			FirstCallTimeout: time.Second, BodyTimeout: 2 * time.Second, // never past the idle timeout
		}},
		{"a budget below one stream still runs one", Config{Bounds: connbounds.Bounds{MaxConnBufferBytes: 1, MaxBufferBytes: 1, MaxConns: 1, FirstCallTimeout: time.Minute, BodyTimeout: time.Millisecond}}, GRPCBounds{
			MaxConns: 1, StreamsPerConn: 1, SharedStreams: 0, MaxMsgBytes: 64 * k, MaxHeaderBytes: 16 * k,
			IdleTimeout: 5 * time.Minute, HandshakeTimeout: 10 * time.Second,
			MaxConnBufferBytes: 128 * k, MaxBufferBytes: 128 * k,
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

// TestUnaryOptions: the decision port's bounds reach the unary server as
// they are, zero fields with connbounds' defaults: the same bounds as grpc-go
// mode's.
func TestUnaryOptions(t *testing.T) {
	b := connbounds.Bounds{MaxConns: 9, MaxStreamsPerConn: 7, MaxMsgBytes: 5 << 10, MaxConnBufferBytes: 30, MaxBufferBytes: 1000000,
		IdleTimeout: time.Minute, FirstCallTimeout: 3 * time.Second, BodyTimeout: 500 * time.Millisecond}
	want := b
	want.MaxHeaderBytes, want.HandshakeTimeout = connbounds.Default.MaxHeaderBytes, connbounds.Default.HandshakeTimeout
	if got := unaryOptions(Config{Bounds: b}); !reflect.DeepEqual(got, grpcunary.Options{Bounds: want}) {
		t.Errorf("unaryOptions = %+v, want %+v", got, want)
	}
	if got := unaryOptions(Config{}); !reflect.DeepEqual(got, grpcunary.Options{Bounds: connbounds.Default}) {
		t.Errorf("unaryOptions of the zero Config = %+v, want connbounds.Default", got)
	}
}

// freeStreams returns the budget's free shared streams.
func (b *streamBudget) freeStreams() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.free
}

// stream opens a stream on a, returning its context and its end.
func (b *streamBudget) stream(a net.Addr) (context.Context, context.CancelFunc, error) {
	ctx, cancel := context.WithCancel(peer.NewContext(context.Background(), &peer.Peer{Addr: a}))
	sctx, err := b.admit(ctx, &tap.Info{})
	return sctx, cancel, err
}

// TestStreamBudget: each connection's first stream is always admitted, the
// others by fair shares; a slot comes back when its stream's context ends,
// and the calls are marked on their connection. Before fair shares,
// connection A took every shared slot and B's second stream was refused.
func TestStreamBudget(t *testing.T) {
	b := newStreamBudget(4, 0)
	connA, connB := &connAddr{Addr: &net.TCPAddr{Port: 1}}, &connAddr{Addr: &net.TCPAddr{Port: 2}}
	var aStreams []context.CancelFunc
	for i := range 3 { // A's own, then shared: share 4/2 = 2
		_, end, err := b.stream(connA)
		if err != nil {
			t.Fatalf("A's stream %d: %v", i+1, err)
		}
		aStreams = append(aStreams, end)
	}
	if _, _, err := b.stream(connA); status.Code(err) != codes.ResourceExhausted { // 2 of 2
		t.Fatalf("A's fourth stream: %v, want ResourceExhausted", err)
	}
	if got := connA.inflight.Load(); got != 3 {
		t.Errorf("A has %d calls in flight, want 3", got)
	}
	for i := range 2 { // B's own, then one of the two free (share 4/3 = 1)
		if _, _, err := b.stream(connB); err != nil {
			t.Fatalf("B's stream %d, A holding its share: %v", i+1, err)
		}
	}
	if _, _, err := b.stream(connB); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("B's third stream: %v, want ResourceExhausted", err)
	}
	aStreams[2]()
	waitUntil(t, "the shared slot back", 5*time.Second, func() bool { return b.freeStreams() == 2 && connA.held.Load() == 1 })
	aStreams[0]()
	waitUntil(t, "A's own slot back", 5*time.Second, func() bool { return connA.guaranteed.Load() == 0 && connA.inflight.Load() == 1 })
	if connA.lastEnd.Load() == 0 {
		t.Error("A's ended calls not marked")
	}
	if got := b.refused.Load(); got != 2 {
		t.Errorf("refused %d, want 2", got)
	}
}

// TestStreamBudgetPreempts: a connection that took more than its share
// (while alone) loses a stream still waiting for its request to a
// connection under its share; a connection whose requests have all
// arrived keeps its streams.
func TestStreamBudgetPreempts(t *testing.T) {
	for _, arrived := range []bool{false, true} {
		b := newStreamBudget(4, 0)
		connA, connB := &connAddr{Addr: &net.TCPAddr{Port: 1}}, &connAddr{Addr: &net.TCPAddr{Port: 2}}
		b.stream(connA) // A's own
		var aShared []context.Context
		for range 2 { // alone, A's share is 4/2
			ctx, _, err := b.stream(connA)
			if err != nil {
				t.Fatal(err)
			}
			if arrived {
				b.arrived(ctx.Value(callKey{}).(*call))
			}
			aShared = append(aShared, ctx)
		}
		b.mu.Lock()
		b.free = 0 // as if others held the rest
		b.mu.Unlock()
		b.stream(connB)              // B's own
		_, _, err := b.stream(connB) // B's share is 4/3: A is over its share
		if arrived {
			if status.Code(err) != codes.ResourceExhausted || b.preempted.Load() != 0 {
				t.Errorf("A's requests in: B got %v, %d preempted; want ResourceExhausted, none", err, b.preempted.Load())
			}
			continue
		}
		if err != nil {
			t.Fatalf("B under its share, A over it: %v", err)
		}
		lost := 0
		for _, ctx := range aShared {
			if context.Cause(ctx) == errPreempted {
				lost++
			}
		}
		if lost != 1 || b.preempted.Load() != 1 || connA.held.Load() != 1 || connB.held.Load() != 1 {
			t.Errorf("A lost %d streams, preempted %d, A holds %d, B %d; want 1, 1, 1, 1", lost, b.preempted.Load(), connA.held.Load(), connB.held.Load())
		}
	}
}

// TestBodyDeadline: an admitted call's context ends bodyTimeout after its
// headers unless the request arrives first.
func TestBodyDeadline(t *testing.T) {
	b := newStreamBudget(10, time.Millisecond)
	ctx, _, err := b.stream(&connAddr{Addr: &net.TCPAddr{Port: 1}})
	if err != nil {
		t.Fatal(err)
	}
	<-ctx.Done()
	if context.Cause(ctx) != errBodyTimeout {
		t.Errorf("cause %v, want errBodyTimeout", context.Cause(ctx))
	}

	b = newStreamBudget(10, time.Hour)
	ctx, _, _ = b.stream(&connAddr{Addr: &net.TCPAddr{Port: 2}})
	if _, err := b.requestArrived(ctx, nil, nil, func(context.Context, any) (any, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	if ctx.Value(callKey{}).(*call).timer.Stop() {
		t.Error("the deadline still runs after the request arrived")
	}
}

// TestStreamBudgetOverGRPC: with no shared streams, a connection that
// holds its own stream (a call whose request never ends) gets
// RESOURCE_EXHAUSTED for a second call and survives; another connection
// is served.
func TestStreamBudgetOverGRPC(t *testing.T) {
	srv := start(t, Config{Policies: policies(t), GRPCServer: GRPCServerGo, Bounds: connbounds.Bounds{MaxBufferBytes: 1}})
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
// health and debug ports), hold at most their cap of connections, making
// room for new ones by closing those that never sent a request, and refuse
// oversized headers.
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
	for range connbounds.OperatorMaxConns + 20 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	waitUntil(t, name+": 20 connections evicted", 5*time.Second, func() bool {
		return counter(t, srv, `sluice_connections_evicted_total`, name) >= 20
	})
	if open := ln.Open(); open > connbounds.OperatorMaxConns {
		t.Errorf("%d connections open, cap %d", open, connbounds.OperatorMaxConns)
	}
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

// TestHTTPWriteTimeout: answers are written within 30 s, and with -pprof
// profiles within 5 minutes: never without a bound (before, -pprof took
// the write timeout away).
func TestHTTPWriteTimeout(t *testing.T) {
	for _, pprof := range []bool{false, true} {
		s := &Server{cfg: Config{Pprof: pprof}, log: slog.Default()}
		want := httpWriteTimeout
		if pprof {
			want = pprofWriteTimeout
		}
		if got := s.httpServer(http.NotFoundHandler()).WriteTimeout; got != want {
			t.Errorf("pprof %v: WriteTimeout %v, want %v", pprof, got, want)
		}
	}
}
