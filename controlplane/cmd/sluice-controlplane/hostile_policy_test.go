package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	sluicev1 "github.com/sluicehq/sluice/controlplane/api/sluice/v1"
	"github.com/sluicehq/sluice/controlplane/internal/server"
	"github.com/sluicehq/sluice/controlplane/store/memory"
	"github.com/sluicehq/sluice/internal/attackload"
)

// The attacks on the policy service by a client that holds a token, against
// the real binary with its default bounds: concurrent Applies of the
// costliest policy, and Watch streams by the thousand. Each measures the
// share of other clients' normal calls that succeed during the attack
// (decisions on a connection opened before it and on fresh ones, ratectl
// list and get on fresh ones) and the process's peak RSS.

// bindRSS is the binary's bound on its RSS (TestBinaryMemoryBound): the
// Go memory limit's share and RSSOverhead.
const bindRSS = memory.DefaultMaxBytes + memory.DefaultMaxBytes/2 + RSSOverhead

// costlyPolicy is about the costliest policy the policy service accepts:
// just under 1 MiB, 9,000 limits and 18,000 descriptors (the set bounds
// allow 10,000 and 20,000), about 60 MiB of allocations to parse. n makes
// each one different.
func costlyPolicy(n int) string {
	var b strings.Builder
	b.WriteString("domain: costly\ndescriptors:\n")
	for i := range 9000 {
		fmt.Fprintf(&b, "  - {key: k, value: v%d, rate_limit: {unit: second, requests_per_unit: %d}, descriptors: [{key: s, value: x}]}\n", i, n)
	}
	return b.String()
}

// policyCall makes one authenticated call on a new connection to the
// policy service, as ratectl does.
func policyCall(addr string, call func(context.Context, sluicev1.PolicyServiceClient) error) error {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+shareToken)
	return call(ctx, sluicev1.NewPolicyServiceClient(cc))
}

// normalDuring makes the normal calls of other clients until done, and
// checks that at least 99.9% of each kind succeeded.
func normalDuring(t *testing.T, grpcAddr, policyAddr string, done <-chan struct{}) {
	t.Helper()
	old := dialUsed(t, grpcAddr)
	var oldT, freshT, listT, getT attackload.Tally
	attackload.During(done,
		attackload.Load{Workers: 2, Call: func() error { return decide(old, "normal") }, Tally: &oldT},
		attackload.Load{Workers: 1, Call: func() error { return freshDecide(grpcAddr, 1) }, Tally: &freshT},
		attackload.Load{Workers: 1, Call: func() error { return policyList(policyAddr) }, Tally: &listT},
		attackload.Load{Workers: 1, Call: func() error {
			return policyCall(policyAddr, func(ctx context.Context, c sluicev1.PolicyServiceClient) error {
				_, err := c.Get(ctx, &sluicev1.GetRequest{Domain: "bin"})
				return err
			})
		}, Tally: &getT})
	oldT.Check(t, "decisions on a connection opened before the attack", 0.999, 20)
	freshT.Check(t, "decisions on fresh connections", 0.999, 5)
	listT.Check(t, "ratectl list on fresh connections", 0.999, 5)
	getT.Check(t, "ratectl get on fresh connections", 0.999, 5)
}

// TestHostileConcurrentApplies: three rounds of 48 concurrent Applies of
// the costliest policy took RSS to 5.6 GiB, decisions to 20% (fresh) and
// 63%, and shutdown past 12 s. Now at most four Applies are admitted at
// once and one is parsed at a time. Each round, 48 connections apply, a
// refused one again 100 ms later, for the round's time: the normal calls
// must succeed >= 99.9%, the peak RSS stay within the binary's bound, and
// a SIGTERM during the third round end the process within the drain limit.
func TestHostileConcurrentApplies(t *testing.T) {
	const attackers, rounds = 48, 3
	p, grpcAddr, httpAddr, policyAddr := shareBinary(t, server.GRPCServerUnary)
	base := measure(t, p, httpAddr)
	var applied, refused atomic.Int64
	var peak int64
	clients := make([]sluicev1.PolicyServiceClient, attackers)
	for i := range clients {
		cc := newClient(t, policyAddr)
		defer cc.Close()
		clients[i] = sluicev1.NewPolicyServiceClient(cc)
	}
	for round := range rounds {
		done := make(chan struct{})
		var wg sync.WaitGroup
		for i, c := range clients {
			doc := costlyPolicy(round*attackers + i + 1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+shareToken)
				for {
					cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
					_, err := c.Apply(cctx, &sluicev1.ApplyRequest{Source: "costly.yaml", Yaml: doc})
					cancel()
					if err == nil {
						applied.Add(1)
						return
					}
					refused.Add(1)
					select {
					case <-done:
						return
					case <-time.After(100 * time.Millisecond):
					}
				}
			}()
		}
		time.AfterFunc(dosAttackTime, func() { close(done) })
		if round < rounds-1 {
			normalDuring(t, grpcAddr, policyAddr, done)
			wg.Wait()
			continue
		}
		// The last round ends with SIGTERM in its midst.
		time.Sleep(dosAttackTime / 2)
		peak = procStatus(t, p.cmd.Process.Pid)["VmHWM"]
		start := time.Now()
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case <-p.exited:
		case <-time.After(15 * time.Second):
			t.Fatalf("still running 15 s after SIGTERM")
		}
		took := time.Since(start)
		wg.Wait()
		t.Logf("SIGTERM during the attack: exited %d after %v", p.exitCode, took.Round(time.Millisecond))
		if took > server.DefaultShutdownTimeout+2*time.Second {
			t.Errorf("shutdown took %v, past the drain limit of %v", took, server.DefaultShutdownTimeout)
		}
	}
	t.Logf("%d Applies stored, %d refused; RSS %d MiB before, peak %d MiB (bound %d MiB)", applied.Load(), refused.Load(), base.rss>>20, peak>>20, bindRSS>>20)
	if peak > bindRSS {
		t.Errorf("peak RSS %d MiB, over the binary's bound of %d MiB", peak>>20, bindRSS>>20)
	}
}

// watchHeaders is the HPACK block of a Watch call with the token.
func watchHeaders(t *testing.T) []byte {
	t.Helper()
	var b bytes.Buffer
	enc := hpack.NewEncoder(&b)
	for _, f := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":authority", "sluice"},
		{":path", "/sluice.v1.PolicyService/Watch"}, {"content-type", "application/grpc"}, {"te", "trailers"},
		{"authorization", "Bearer " + shareToken},
	} {
		if err := enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1], Sensitive: true}); err != nil {
			t.Fatal(err)
		}
	}
	return b.Bytes()
}

// fourMiB fills the store with four domains of about 1 MiB each (the
// set's bound is 4 MiB), which every Watch's first message carries.
func fourMiB(t *testing.T, policyAddr string) {
	t.Helper()
	for i := range 4 {
		var b strings.Builder
		fmt.Fprintf(&b, "domain: big%d\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n", i)
		for b.Len() < 1_000_000 {
			b.WriteString("# " + strings.Repeat("x", 998) + "\n")
		}
		if err := policyCall(policyAddr, func(ctx context.Context, c sluicev1.PolicyServiceClient) error {
			_, err := c.Apply(ctx, &sluicev1.ApplyRequest{Source: "big.yaml", Yaml: b.String()})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestHostileWatchers: 64 connections each holding a Watch made ratectl
// list fail (0/270), and 1,024 Watch streams that never read, on a 4 MiB
// store, took 4.4 GiB (a snapshot each) and decisions to 94.9%. Now the
// watchers are capped (4 a connection, 32 in all), share one copy of each
// message, and one that does not read is dropped: the normal calls must
// succeed >= 99.9% during both attacks, and the peak RSS stay within
// 128 MiB of what it was before them.
func TestHostileWatchers(t *testing.T) {
	const budget = 128 << 20
	attackload.RaiseOpenFiles(t, 4096)
	p, grpcAddr, httpAddr, policyAddr := shareBinary(t, server.GRPCServerUnary)
	fourMiB(t, policyAddr)
	base := measure(t, p, httpAddr)

	// 64 connections, each holding one Watch that reads.
	t.Run("64 held", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var held, refusedW int
		for range 64 {
			cc, err := grpc.NewClient(policyAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			wctx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+shareToken)
			w, err := sluicev1.NewPolicyServiceClient(cc).Watch(wctx, &sluicev1.WatchRequest{})
			if err == nil {
				_, err = w.Recv()
			}
			if err != nil {
				refusedW++
				continue
			}
			held++
			go func() {
				for {
					if _, err := w.Recv(); err != nil {
						return
					}
				}
			}()
		}
		t.Logf("%d Watch streams held, %d refused", held, refusedW)
		done := make(chan struct{})
		time.AfterFunc(dosAttackTime, func() { close(done) })
		normalDuring(t, grpcAddr, policyAddr, done)
	})

	// 64 connections opening 16 Watch streams each and never reading.
	t.Run("1024 never read", func(t *testing.T) {
		block := watchHeaders(t)
		empty := []byte{0, 0, 0, 0, 0} // an empty WatchRequest
		var conns []*rawConn
		defer func() {
			for _, c := range conns {
				c.nc.Close()
			}
		}()
		for range 64 {
			c, err := dialRaw(policyAddr)
			if err != nil {
				t.Fatal(err)
			}
			conns = append(conns, c)
			for s := range 16 {
				id := uint32(2*s + 1)
				c.nc.SetWriteDeadline(time.Now().Add(time.Second))
				c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndHeaders: true})
				c.fr.WriteData(id, true, empty)
			}
		}
		done := make(chan struct{})
		time.AfterFunc(dosAttackTime, func() { close(done) })
		normalDuring(t, grpcAddr, policyAddr, done)
	})
	after := measure(t, p, httpAddr)
	t.Logf("RSS %d MiB before the attacks, peak %d MiB after (%d MiB more; budget %d MiB)", base.rss>>20, after.peak>>20, (after.peak-base.rss)>>20, budget>>20)
	if after.peak > base.rss+budget {
		t.Errorf("peak RSS %d MiB, more than %d MiB over the %d MiB before the attacks", after.peak>>20, budget>>20, base.rss>>20)
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit %d after SIGTERM:\n%s", code, p.output())
	}
}
