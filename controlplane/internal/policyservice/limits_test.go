package policyservice

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unsafe"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	sluicev1 "github.com/sluicehq/sluice/controlplane/api/sluice/v1"
	"github.com/sluicehq/sluice/controlplane/internal/policystore"
)

// limitedServer serves a Service with lim as the server package wires it:
// the tap admits calls after authentication, and the codec sends the
// shared answers.
func limitedServer(t *testing.T, lim Limits) (*Service, *policystore.Store, string) {
	t.Helper()
	b, err := policystore.NewFile(filepath.Join(t.TempDir(), "p.json"))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	st, err := policystore.New(context.Background(), b, policystore.Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	svc := New(st, Options{Logger: log, Limits: lim})
	auth, err := NewAuthenticator(AuthConfig{Tokens: []string{testToken}, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(
		grpc.InTapHandle(func(ctx context.Context, info *tap.Info) (context.Context, error) {
			ctx, err := auth.TapHandle(ctx, info)
			if err != nil {
				return ctx, err
			}
			return svc.TapHandle(ctx, info)
		}),
		grpc.ChainUnaryInterceptor(auth.UnaryInterceptor()), grpc.ChainStreamInterceptor(auth.StreamInterceptor()),
		grpc.ForceServerCodecV2(svc.Codec(encoding.GetCodecV2(grpcproto.Name))))
	svc.Register(gs)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(ln)
	t.Cleanup(func() {
		st.Close()
		gs.Stop()
	})
	return svc, st, ln.Addr().String()
}

// newPolicyClient returns a client on a connection of its own.
func newPolicyClient(t *testing.T, addr string) sluicev1.PolicyServiceClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(bearer(testToken)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return sluicev1.NewPolicyServiceClient(cc)
}

// openWatch opens a Watch and returns it with its first error (nil: the
// first message arrived).
func openWatch(t *testing.T, c sluicev1.PolicyServiceClient) (context.CancelFunc, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w, err := c.Watch(ctx, &sluicev1.WatchRequest{})
	if err == nil {
		_, err = w.Recv()
	}
	return cancel, err
}

// TestWatchLimits: Watch streams are refused with RESOURCE_EXHAUSTED past
// the cap of a connection and past the cap in all; a closed one frees its
// slot.
func TestWatchLimits(t *testing.T) {
	svc, _, addr := limitedServer(t, Limits{MaxWatches: 3, MaxWatchesPerConn: 2})
	one, two := newPolicyClient(t, addr), newPolicyClient(t, addr)
	first, err := openWatch(t, one)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := openWatch(t, one); err != nil {
		t.Fatal(err)
	}
	if _, err := openWatch(t, one); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "this connection") {
		t.Fatalf("a third Watch on one connection: %v, want RESOURCE_EXHAUSTED", err)
	}
	if _, err := openWatch(t, two); err != nil {
		t.Fatal(err)
	}
	if _, err := openWatch(t, two); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "3 Watch streams are open") {
		t.Fatalf("a fourth Watch in all: %v, want RESOURCE_EXHAUSTED", err)
	}
	if _, err := two.List(context.Background(), &sluicev1.ListRequest{}); err != nil {
		t.Fatalf("List at the Watch cap: %v", err)
	}
	first()
	waitGate(t, svc, func(g *gate) bool { return g.watches == 2 })
	if _, err := openWatch(t, two); err != nil {
		t.Fatalf("a Watch after one closed: %v", err)
	}
}

// waitGate waits until cond holds for svc's gate.
func waitGate(t *testing.T, svc *Service, cond func(*gate) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		svc.gate.mu.Lock()
		ok := cond(&svc.gate)
		svc.gate.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the gate did not reach the state within 10 s")
		}
		time.Sleep(10 * time.Millisecond) // the server ends the stream on its own
	}
}

// TestApplyAdmission: past MaxApplies in progress, Apply is refused with
// RESOURCE_EXHAUSTED before its request is read; a slot frees when its call
// ends.
func TestApplyAdmission(t *testing.T) {
	g := gate{lim: Limits{MaxApplies: 2}.withDefaults(), perConn: map[string]int{}}
	var releases []func()
	for i := range 2 {
		release, err := g.admit(context.Background(), applyMethod)
		if err != nil || release == nil {
			t.Fatalf("Apply %d: %v", i, err)
		}
		releases = append(releases, release)
	}
	if _, err := g.admit(context.Background(), applyMethod); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a third Apply: %v, want RESOURCE_EXHAUSTED", err)
	}
	if release, err := g.admit(context.Background(), "/sluice.v1.PolicyService/List"); err != nil || release != nil {
		t.Fatalf("List: %v; want it to pass without a slot", err)
	}
	releases[0]()
	if _, err := g.admit(context.Background(), applyMethod); err != nil {
		t.Fatalf("an Apply after one ended: %v", err)
	}
}

// TestSharedAnswers: the answers of one version go to every client as the
// same bytes: List, Get and the Watch messages are encoded once.
func TestSharedAnswers(t *testing.T) {
	svc, st, addr := limitedServer(t, Limits{})
	ctx := context.Background()
	for i, d := range []string{"api", "web"} {
		if _, err := st.Apply(ctx, d+".yaml", []byte(domainYAML(d, i+1)), policystore.Guard{}); err != nil {
			t.Fatal(err)
		}
	}
	c := newPolicyClient(t, addr)
	l1, err := svc.List(ctx, &sluicev1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	l2, _ := svc.List(ctx, &sluicev1.ListRequest{})
	g1, _ := svc.Get(ctx, &sluicev1.GetRequest{Domain: "api"})
	g2, _ := svc.Get(ctx, &sluicev1.GetRequest{Domain: "api"})
	w1 := svc.shared.watchMessage(nil, st.Current())
	w2 := svc.shared.watchMessage(nil, st.Current())
	codec := svc.Codec(encoding.GetCodecV2(grpcproto.Name))
	for _, pair := range [][2]any{{l1, l2}, {g1, g2}, {w1, w2}} {
		a, err := codec.Marshal(pair[0])
		if err != nil {
			t.Fatal(err)
		}
		b, _ := codec.Marshal(pair[1])
		if pair[0] != pair[1] || len(a) != 1 || len(b) != 1 || unsafe.SliceData(a[0].ReadOnlyData()) != unsafe.SliceData(b[0].ReadOnlyData()) {
			t.Errorf("%T: two answers of one version are not the same bytes", pair[0])
		}
	}
	// Over the wire, as a client decodes them.
	res, err := c.List(ctx, &sluicev1.ListRequest{})
	if err != nil || len(res.Policies) != 2 || res.Policies[1].Domain != "web" {
		t.Fatalf("List over the wire: %v, %v", res, err)
	}
	// A new version: new answers.
	if _, err := st.Apply(ctx, "api.yaml", []byte(domainYAML("api", 9)), policystore.Guard{}); err != nil {
		t.Fatal(err)
	}
	if l3, _ := svc.List(ctx, &sluicev1.ListRequest{}); l3 == l1 {
		t.Error("List after a change returned the old answer")
	}
}

// TestWatcherThatDoesNotRead: a watcher that has not taken a message when
// the next is due is ended (RESOURCE_EXHAUSTED) within WatchSendTimeout,
// and its slot is freed.
func TestWatcherThatDoesNotRead(t *testing.T) {
	svc, st, addr := limitedServer(t, Limits{WatchSendTimeout: 200 * time.Millisecond})
	ctx := context.Background()
	big := func(n int) []byte {
		var b strings.Builder
		b.WriteString("domain: big\ndescriptors:\n")
		for i := range 1500 {
			fmt.Fprintf(&b, "  - {key: k, value: v%d-%s, rate_limit: {unit: second, requests_per_unit: %d}}\n", i, strings.Repeat("x", 100), n)
		}
		return []byte(b.String())
	}
	if _, err := st.Apply(ctx, "big.yaml", big(1), policystore.Guard{}); err != nil {
		t.Fatal(err)
	}
	c := newPolicyClient(t, addr)
	w, err := c.Watch(ctx, &sluicev1.WatchRequest{}) // never read until the end
	if err != nil {
		t.Fatal(err)
	}
	waitGate(t, svc, func(g *gate) bool { return g.watches == 1 })
	for n := 2; n <= 3; n++ {
		if _, err := st.Apply(ctx, "big.yaml", big(n), policystore.Guard{}); err != nil {
			t.Fatal(err)
		}
	}
	waitGate(t, svc, func(g *gate) bool { return g.watches == 0 })
	for {
		if _, err := w.Recv(); err != nil {
			if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "must read") {
				t.Fatalf("the watcher's stream ended with %v, want RESOURCE_EXHAUSTED", err)
			}
			break
		}
	}
}
