package grpcunary

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/controlplane/internal/connbounds"
)

// testbed is a Server with test methods on a loopback port, and a grpc-go
// client connection to it: the client is the independent judge of the
// protocol.
type testbed struct {
	srv    *Server
	addr   string
	served chan error
	cc     *grpc.ClientConn

	mu      sync.Mutex
	batches []int      // the sizes of the batches /test.Echo/Batch got
	ctxErrs chan error // the context error Wait's handler saw
	release chan struct{}
	started chan struct{}
}

func newTestbed(t *testing.T, opts Options) *testbed {
	t.Helper()
	tb := &testbed{
		srv: New(opts), served: make(chan error, 1), ctxErrs: make(chan error, 16),
		release: make(chan struct{}), started: make(chan struct{}, 16),
	}
	tb.srv.Handle("/test.Echo/Echo", func(ctx context.Context, req []byte) ([]byte, error) {
		var in wrapperspb.BytesValue
		if err := proto.Unmarshal(req, &in); err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		return proto.Marshal(&in)
	})
	tb.srv.Handle("/test.Echo/Fail", func(ctx context.Context, req []byte) ([]byte, error) {
		var in wrapperspb.StringValue
		if err := proto.Unmarshal(req, &in); err != nil {
			return nil, err
		}
		if in.Value == "plain" {
			return nil, errors.New("a plain error")
		}
		return nil, status.Error(codes.PermissionDenied, in.Value)
	})
	tb.srv.Handle("/test.Echo/Wait", func(ctx context.Context, req []byte) ([]byte, error) {
		tb.started <- struct{}{}
		select {
		case <-ctx.Done():
			tb.ctxErrs <- ctx.Err()
			return nil, ctx.Err()
		case <-tb.release:
			return proto.Marshal(wrapperspb.Bytes([]byte("released")))
		}
	})
	tb.srv.HandleBatch("/test.Echo/Batch", func(ctx context.Context, calls []Call) {
		tb.mu.Lock()
		tb.batches = append(tb.batches, len(calls))
		tb.mu.Unlock()
		for i := range calls {
			var in wrapperspb.BytesValue
			if err := proto.Unmarshal(calls[i].Req, &in); err != nil {
				calls[i].Err = status.Error(codes.InvalidArgument, err.Error())
				continue
			}
			if string(in.Value) == "fail" {
				calls[i].Err = status.Error(codes.FailedPrecondition, "asked to fail")
				continue
			}
			calls[i].Resp, calls[i].Err = proto.Marshal(&in)
		}
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tb.addr = ln.Addr().String()
	go func() { tb.served <- tb.srv.Serve(ln) }()
	tb.cc, err = grpc.NewClient(tb.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		tb.cc.Close()
		tb.srv.Stop()
	})
	return tb
}

func (tb *testbed) echo(ctx context.Context, b []byte) ([]byte, error) {
	var out wrapperspb.BytesValue
	err := tb.cc.Invoke(ctx, "/test.Echo/Echo", wrapperspb.Bytes(b), &out)
	return out.Value, err
}

func TestEcho(t *testing.T) {
	tb := newTestbed(t, Options{Bounds: connbounds.Bounds{MaxMsgBytes: 16 << 20}})
	ctx := context.Background()
	// Sizes around the frame size, the client's initial stream window (64
	// KiB) and our receive window (1 MiB), so that both directions' flow
	// control is exercised.
	for _, n := range []int{0, 1, 16383, 16384, 16385, 65535, 65536, 200000, 1 << 20, 3<<20 + 7} {
		in := bytes.Repeat([]byte{byte(n)}, n)
		for i := range in {
			in[i] = byte(i * 7)
		}
		out, err := tb.echo(ctx, in)
		if err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		if !bytes.Equal(out, in) {
			t.Fatalf("%d bytes: echo differs (%d bytes back)", n, len(out))
		}
	}
}

func TestConcurrentCalls(t *testing.T) {
	tb := newTestbed(t, Options{})
	const callers, calls = 64, 100
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for g := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range calls {
				want := []byte(strings.Repeat("x", (g*calls+i)%3000))
				got, err := tb.echo(context.Background(), want)
				if err != nil || !bytes.Equal(got, want) {
					errs <- errors.Join(err, errors.New("wrong echo"))
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func TestErrors(t *testing.T) {
	tb := newTestbed(t, Options{})
	ctx := context.Background()
	for _, tc := range []struct {
		in   string
		code codes.Code
		msg  string
	}{
		{"denied", codes.PermissionDenied, "denied"},
		{"100% sure: naïve\nline two", codes.PermissionDenied, "100% sure: naïve\nline two"},
		{"plain", codes.Unknown, "a plain error"},
		{strings.Repeat("é", 2000), codes.PermissionDenied, strings.Repeat("é", 170)}, // cut at 1024 escaped bytes
	} {
		var out wrapperspb.StringValue
		err := tb.cc.Invoke(ctx, "/test.Echo/Fail", wrapperspb.String(tc.in), &out)
		s, _ := status.FromError(err)
		if s.Code() != tc.code || s.Message() != tc.msg {
			t.Errorf("%.20q: got %v %.40q, want %v %.40q", tc.in, s.Code(), s.Message(), tc.code, tc.msg)
		}
	}
	err := tb.cc.Invoke(ctx, "/test.Echo/Nope", wrapperspb.String(""), &wrapperspb.StringValue{})
	if status.Code(err) != codes.Unimplemented || !strings.Contains(err.Error(), "/test.Echo/Nope") {
		t.Errorf("unknown method: %v", err)
	}
	// The connection still works after errors.
	if _, err := tb.echo(ctx, []byte("ok")); err != nil {
		t.Fatal(err)
	}
}

func TestMaxMsgBytes(t *testing.T) {
	tb := newTestbed(t, Options{Bounds: connbounds.Bounds{MaxMsgBytes: 1000}})
	_, err := tb.echo(context.Background(), make([]byte, 5000))
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("got %v, want ResourceExhausted", err)
	}
	if _, err := tb.echo(context.Background(), make([]byte, 900)); err != nil {
		t.Fatal(err)
	}
}

func TestDeadlineReachesHandler(t *testing.T) {
	tb := newTestbed(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err := tb.cc.Invoke(ctx, "/test.Echo/Wait", wrapperspb.Bytes(nil), &wrapperspb.BytesValue{})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("client: %v", err)
	}
	select {
	case err := <-tb.ctxErrs:
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			t.Fatalf("handler's context ended with %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the handler's context never ended")
	}
}

func TestCancelReachesHandler(t *testing.T) {
	tb := newTestbed(t, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- tb.cc.Invoke(ctx, "/test.Echo/Wait", wrapperspb.Bytes(nil), &wrapperspb.BytesValue{})
	}()
	<-tb.started
	cancel()
	if err := <-done; status.Code(err) != codes.Canceled {
		t.Fatalf("client: %v", err)
	}
	select {
	case err := <-tb.ctxErrs:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("handler's context ended with %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("RST_STREAM did not cancel the handler's context")
	}
}

func TestGracefulStopAnswersCallsInProgress(t *testing.T) {
	tb := newTestbed(t, Options{})
	done := make(chan error, 1)
	var out wrapperspb.BytesValue
	go func() {
		done <- tb.cc.Invoke(context.Background(), "/test.Echo/Wait", wrapperspb.Bytes(nil), &out)
	}()
	<-tb.started
	stopped := make(chan struct{})
	go func() { tb.srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
		t.Fatal("GracefulStop returned with a call in progress")
	case <-time.After(100 * time.Millisecond):
	}
	close(tb.release)
	if err := <-done; err != nil || string(out.Value) != "released" {
		t.Fatalf("call in progress: %v %q", err, out.Value)
	}
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("GracefulStop did not return after the last call")
	}
	if err := <-tb.served; !errors.Is(err, ErrServerStopped) {
		t.Fatalf("Serve returned %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := tb.echo(ctx, nil); err == nil {
		t.Fatal("a call after GracefulStop succeeded")
	}
}

func TestStopCancelsCalls(t *testing.T) {
	tb := newTestbed(t, Options{})
	done := make(chan error, 1)
	go func() {
		done <- tb.cc.Invoke(context.Background(), "/test.Echo/Wait", wrapperspb.Bytes(nil), &wrapperspb.BytesValue{})
	}()
	<-tb.started
	tb.srv.Stop()
	if err := <-done; status.Code(err) != codes.Unavailable {
		t.Fatalf("client: %v", err)
	}
	if err := <-tb.ctxErrs; !errors.Is(err, context.Canceled) {
		t.Fatalf("handler: %v", err)
	}
}

func TestParseTimeout(t *testing.T) {
	for _, tc := range []struct {
		in string
		d  time.Duration
		ok bool
	}{
		{"1S", time.Second, true},
		{"20m", 20 * time.Millisecond, true},
		{"99999999u", 99999999 * time.Microsecond, true},
		{"5n", 5, true},
		{"2M", 2 * time.Minute, true},
		{"99999999H", 1<<63 - 1, true},
		{"1", 0, false},
		{"S", 0, false},
		{"123456789S", 0, false},
		{"1s", 0, false},
		{"-1S", 0, false},
		{"1.5S", 0, false},
	} {
		d, ok := parseTimeout(tc.in)
		if d != tc.d || ok != tc.ok {
			t.Errorf("parseTimeout(%q) = %v, %v; want %v, %v", tc.in, d, ok, tc.d, tc.ok)
		}
	}
}

func TestEncodeMessage(t *testing.T) {
	for in, want := range map[string]string{
		"":           "",
		"plain text": "plain text",
		"100%":       "100%25",
		"a\nb":       "a%0Ab",
		"ü":          "%C3%BC",
		"\x7f\x1f~ ": "%7F%1F~ ",
	} {
		if got := encodeMessage(in); got != want {
			t.Errorf("encodeMessage(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestBatchHandler: calls of a batch method sent together are answered
// each with its own answer or error, and arrive in batches of several.
func TestBatchHandler(t *testing.T) {
	tb := newTestbed(t, Options{})
	const callers, calls = 32, 50
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for g := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range calls {
				in := []byte(strings.Repeat("b", (g+i)%50))
				if (g+i)%7 == 0 {
					in = []byte("fail")
				}
				var out wrapperspb.BytesValue
				err := tb.cc.Invoke(context.Background(), "/test.Echo/Batch", wrapperspb.Bytes(in), &out)
				switch {
				case string(in) == "fail":
					if status.Code(err) != codes.FailedPrecondition {
						errs <- fmt.Errorf("a failing call: %v", err)
						return
					}
				case err != nil || !bytes.Equal(out.Value, in):
					errs <- fmt.Errorf("call %q: %v %q", in, err, out.Value)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	tb.mu.Lock()
	defer tb.mu.Unlock()
	n, most := 0, 0
	for _, b := range tb.batches {
		n += b
		most = max(most, b)
		if b < 1 || b > MaxBatch {
			t.Fatalf("a batch of %d calls", b)
		}
	}
	if n != callers*calls {
		t.Fatalf("%d calls in batches, want %d", n, callers*calls)
	}
	if most < 2 {
		t.Errorf("%d concurrent callers never made a batch of more than one call", callers)
	}
	t.Logf("%d calls in %d batches, the largest %d", n, len(tb.batches), most)
}
