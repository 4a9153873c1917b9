package main

import (
	"bytes"
	be "encoding/binary" // (binary is main_test.go's)
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/controlplane/store/memory"
	"github.com/sluicehq/sluice/internal/attackload"
)

// Attacks that deny the unary decision port of the built binary to others,
// with its default bounds (1,024 connections, 100 streams and 4 MiB a
// connection, 64 MiB in all): each measures the share of normal
// ShouldRateLimit calls that succeed during the attack, on fresh
// connections and on a connection opened before it.

// dosAttackTime bounds each attack.
const dosAttackTime = 3 * time.Second

// decideDuring makes normal calls until done: parallel at a time on old
// (opened before the attack) and freshers at a time on fresh connections.
func decideDuring(addr string, old *grpc.ClientConn, parallel, freshers int, done <-chan struct{}, oldT, freshT *attackload.Tally) {
	attackload.During(done,
		attackload.Load{Workers: parallel, Call: func() error { return decide(old, "normal") }, Tally: oldT},
		attackload.Load{Workers: freshers, Call: func() error { return freshDecide(addr, 1) }, Tally: freshT})
}

// dialUsed returns a client connection to addr that has completed a call.
func dialUsed(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	if err := decide(cc, "normal"); err != nil {
		t.Fatalf("a call before the attack: %v", err)
	}
	return cc
}

// TestBinaryUnaryNeverEndingBodies: 64 connections start requests that
// announce a 60 KiB message, send 16 KiB and a byte of it (the server
// holds 32 KiB for each), and never end them, 32 at once and then 4 more
// every 100 ms each: four times the server's 64 MiB budget. They held it
// all, and 0.2% of normal calls succeeded on a connection opened before
// the attack, 0.4% on fresh ones (RESOURCE_EXHAUSTED). Now a connection
// within its fair share takes room from those beyond theirs, and late
// bodies are reset: >= 99.9% of normal calls must succeed, and the RSS
// stays within the binary's bound (1.5 x -memory-max-bytes + RSSOverhead:
// the Go memory limit bounds the garbage the attack churns at -gc-percent
// 400; the 64 MiB of bodies are within RSSOverhead's share for the
// decision port and the memory store's unused share).
func TestBinaryUnaryNeverEndingBodies(t *testing.T) {
	const conns, first = 64, 32
	const budgetRSS = memory.DefaultMaxBytes + memory.DefaultMaxBytes/2 + RSSOverhead
	p, rec := startBinary(t, nil, "-policy", writePolicy(t, binPolicy))
	addr := rec["grpc"].(string)
	old := dialUsed(t, addr)
	base := procRSS(t, p.cmd.Process.Pid)

	block := rawBlock(t)
	data := make([]byte, 16<<10)
	be.BigEndian.PutUint32(data[1:5], 60<<10)
	until := time.Now().Add(dosAttackTime)
	var wg sync.WaitGroup
	for range conns {
		nc := dialH2(t, addr)
		nc.Write(windowUpdate(0, 1<<30))
		wg.Add(2)
		go func() {
			defer wg.Done()
			io.Copy(io.Discard, nc) // what the server sends does not pile up
		}()
		go func() {
			defer wg.Done()
			defer nc.Close()
			nc.SetWriteDeadline(until)
			id := uint32(1)
			for n := first; time.Now().Before(until); n = 4 {
				for range n {
					var b []byte
					b = appendFrame(b, http2.FrameHeaders, http2.FlagHeadersEndHeaders, id, block)
					b = appendFrame(b, http2.FrameData, 0, id, data)
					b = appendFrame(b, http2.FrameData, 0, id, []byte{0})
					if _, err := nc.Write(b); err != nil {
						return
					}
					id += 2
				}
				time.Sleep(100 * time.Millisecond)
			}
		}()
	}
	var peak atomic.Uint64
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			peak.Store(max(peak.Load(), procRSS(t, p.cmd.Process.Pid)))
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	time.Sleep(300 * time.Millisecond) // the first streams fill the budget
	var oldT, freshT attackload.Tally
	decideDuring(addr, old, 4, 2, done, &oldT, &freshT)
	<-sampled
	t.Logf("RSS %.0f MiB before the attack, peak %.0f MiB", float64(base)/(1<<20), float64(peak.Load())/(1<<20))
	oldT.Check(t, "a connection opened before the attack", 0.999, 20)
	freshT.Check(t, "fresh connections", 0.999, 10)
	if peak.Load() > budgetRSS {
		t.Errorf("peak RSS %.0f MiB, over the binary's bound of %d MiB", float64(peak.Load())/(1<<20), budgetRSS>>20)
	}
	if err := decide(old, "normal"); err != nil {
		t.Errorf("a call after the attack: %v", err)
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit %d after SIGTERM:\n%s", code, p.output())
	}

}

// TestBinaryUnaryIdleConnections: 2,000 connections that send the preface
// and SETTINGS and then nothing held all of the 1,024 slots, and every new
// client was refused (0%) until the idle timeout (5 min). Now a new
// connection at the cap closes the idlest (those that never completed a
// call first): >= 99% of new clients' calls must succeed, and the
// connection in use before the attack keeps working. The peak RSS grows by
// at most 160 MiB: the connections open and those closing (at most
// -max-conns each) at about 51 KB each, and slack.
func TestBinaryUnaryIdleConnections(t *testing.T) {
	const attackers, budgetRSS = 2000, 160 << 20
	attackload.RaiseOpenFiles(t, 3*attackers)
	p, rec := startBinary(t, nil, "-policy", writePolicy(t, binPolicy))
	addr := rec["grpc"].(string)
	old := dialUsed(t, addr)
	base := procRSS(t, p.cmd.Process.Pid)

	var closed atomic.Int64
	var ncs []net.Conn
	var wg sync.WaitGroup
	for range attackers {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		ncs = append(ncs, nc)
		nc.Write(append([]byte(http2.ClientPreface), 0, 0, 0, byte(http2.FrameSettings), 0, 0, 0, 0, 0))
		wg.Add(1)
		go func() {
			defer wg.Done()
			io.Copy(io.Discard, nc)
			closed.Add(1)
		}()
	}
	defer func() {
		for _, nc := range ncs {
			nc.Close()
		}
		wg.Wait()
	}()
	done := make(chan struct{})
	time.AfterFunc(dosAttackTime, func() { close(done) })
	var oldT, freshT attackload.Tally
	decideDuring(addr, old, 1, 4, done, &oldT, &freshT)
	rss := uint64(procStatus(t, p.cmd.Process.Pid)["VmHWM"])
	t.Logf("%d of %d idle connections closed by the server; RSS %.0f MiB before, peak %.0f MiB",
		closed.Load(), attackers, float64(base)/(1<<20), float64(rss)/(1<<20))
	freshT.Check(t, "new clients", 0.99, 10)
	oldT.Check(t, "a connection opened before the attack", 0.999, 10)
	if rss > base+budgetRSS {
		t.Errorf("RSS grew by %.0f MiB, over %d MiB", float64(rss-base)/(1<<20), budgetRSS>>20)
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit %d after SIGTERM:\n%s", code, p.output())
	}
}

// TestParseUnaryTimeoutFlags: -first-call-timeout and
// -request-body-timeout (and their $SLUICE_ variables) are read (server's
// TestUnaryOptions: they reach the unary server); they must be positive.
func TestParseUnaryTimeoutFlags(t *testing.T) {
	env := map[string]string{"SLUICE_FIRST_CALL_TIMEOUT": "3s", "SLUICE_REQUEST_BODY_TIMEOUT": "4s"}
	c, err := parseFlags([]string{"-request-body-timeout", "500ms"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil || c.firstCallTimeout != 3*time.Second || c.requestBodyTimeout != 500*time.Millisecond {
		t.Fatalf("%+v, %v", c, err)
	}
	c, err = parseFlags(nil, func(string) string { return "" }, io.Discard)
	if err != nil || c.firstCallTimeout != 10*time.Second || c.requestBodyTimeout != 2*time.Second {
		t.Fatalf("defaults: %+v, %v", c, err)
	}
	for _, args := range [][]string{{"-first-call-timeout", "0s"}, {"-request-body-timeout", "-1s"}} {
		if _, err := parseFlags(args, func(string) string { return "" }, io.Discard); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}

// rawBlock is the HPACK block of a ShouldRateLimit request's headers, of
// literals that leave the dynamic table alone, so that it can be sent any
// number of times.
func rawBlock(t *testing.T) []byte {
	t.Helper()
	var b bytes.Buffer
	enc := hpack.NewEncoder(&b)
	for _, f := range []hpack.HeaderField{
		{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"}, {Name: ":authority", Value: "sluice"},
		{Name: ":path", Value: "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"},
		{Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
	} {
		f.Sensitive = true
		if err := enc.WriteField(f); err != nil {
			t.Fatal(err)
		}
	}
	return b.Bytes()
}

// appendFrame appends an HTTP/2 frame.
func appendFrame(b []byte, typ http2.FrameType, flags http2.Flags, id uint32, payload []byte) []byte {
	n := len(payload)
	b = append(b, byte(n>>16), byte(n>>8), byte(n), byte(typ), byte(flags))
	b = be.BigEndian.AppendUint32(b, id)
	return append(b, payload...)
}

// windowUpdate is a WINDOW_UPDATE frame.
func windowUpdate(id, inc uint32) []byte {
	return appendFrame(nil, http2.FrameWindowUpdate, 0, id, be.BigEndian.AppendUint32(nil, inc))
}
