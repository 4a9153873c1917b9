package main

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestBinaryDecisionPortAttacks runs the built binary with the unary
// decision server and attacks its decision port: a client that
// floods PINGs and never reads, and more connections than -max-conns
// (given as $SLUICE_MAX_CONNS), which are turned away (by closing the
// idlest to make room, or refused while those close). The process's RSS
// must stay within budget,
// a ShouldRateLimit call on an established connection must succeed during
// each attack and after it, and the goroutines must come back to their
// baseline.
func TestBinaryDecisionPortAttacks(t *testing.T) {
	const maxConns, budget = 16, 64 << 20
	p, rec := startBinary(t, []string{"SLUICE_MAX_CONNS=" + strconv.Itoa(maxConns)}, "-policy", writePolicy(t, binPolicy), "-pprof")
	grpcAddr, httpAddr := rec["grpc"].(string), rec["http"].(string)
	cc, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	rls := rlsv3.NewRateLimitServiceClient(cc)
	decide := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
			Domain:      "bin",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "normal"}}}},
		})
		return err
	}
	if err := decide(); err != nil {
		t.Fatal(err)
	}
	baseRSS, baseG := procRSS(t, p.cmd.Process.Pid), goroutines(t, httpAddr)

	// attack runs fn while deciding on cc, and checks the bounds.
	attack := func(name string, fn func()) {
		var peak uint64
		var calls int
		done := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				peak = max(peak, procRSS(t, p.cmd.Process.Pid))
				if err := decide(); err != nil {
					t.Errorf("%s: ShouldRateLimit during the attack: %v", name, err)
					return
				}
				calls++
				select {
				case <-done:
					return
				case <-time.After(10 * time.Millisecond):
				}
			}
		}()
		fn()
		close(done)
		wg.Wait()
		ended := time.Now()
		g := goroutines(t, httpAddr)
		for ; g > baseG && time.Since(ended) < 5*time.Second; g = goroutines(t, httpAddr) {
			time.Sleep(10 * time.Millisecond) // the process ends the attack's connections
		}
		recovery := time.Since(ended)
		if g > baseG {
			t.Errorf("%s: %d goroutines, %d before", name, g, baseG)
		}
		if err := decide(); err != nil {
			t.Errorf("%s: ShouldRateLimit after the attack: %v", name, err)
		}
		t.Logf("%s: RSS %.0f MiB before, peak %.0f MiB; %d calls decided during it; goroutines back to %d in %v",
			name, float64(baseRSS)/(1<<20), float64(peak)/(1<<20), calls, g, recovery.Round(time.Millisecond))
		if peak > baseRSS+budget {
			t.Errorf("%s: RSS grew by %.0f MiB, over the budget of %d MiB", name, float64(peak-baseRSS)/(1<<20), budget>>20)
		}
	}

	attack("PING flood, never read", func() {
		nc := dialH2(t, grpcAddr)
		nc.(*net.TCPConn).SetReadBuffer(4 << 10)
		ping := make([]byte, 0, 17*1000)
		for range 1000 {
			ping = append(ping, 0, 0, 8, byte(http2.FramePing), 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8)
		}
		// The promise is that the flood's connection ends; a busy machine
		// took more than 5 s to read the frames that end it.
		const closeLimit = 30 * time.Second
		start := time.Now()
		nc.SetWriteDeadline(start.Add(closeLimit))
		for {
			if _, err := nc.Write(ping); err != nil {
				break
			}
		}
		if d := time.Since(start); d >= closeLimit {
			t.Errorf("the connection was not closed within %v", closeLimit)
		} else {
			t.Logf("the process closed the flooding connection after %v", d.Round(time.Millisecond))
		}
		nc.Close()
	})

	attack("connections over -max-conns", func() {
		// Each connection past the cap makes room by closing the idlest
		// (GOAWAY NO_ERROR), or is refused (GOAWAY ENHANCE_YOUR_CALM)
		// while as many as the cap are still closing; cc's connection,
		// which is in use, stays. Every other connection is turned away.
		var ncs []net.Conn
		for range 10 * maxConns {
			ncs = append(ncs, dialH2(t, grpcAddr))
		}
		var turned atomic.Int32
		var wg sync.WaitGroup
		until := time.Now().Add(5 * time.Second)
		for _, nc := range ncs {
			wg.Add(1)
			go func() { // until its GOAWAY, or until
				defer wg.Done()
				nc.SetReadDeadline(until)
				fr := http2.NewFramer(nil, nc)
				for {
					f, err := fr.ReadFrame()
					if err != nil {
						return
					}
					if _, ok := f.(*http2.GoAwayFrame); ok {
						turned.Add(1)
						return
					}
				}
			}()
		}
		wg.Wait()
		for _, nc := range ncs {
			nc.Close()
		}
		// One connection is cc's.
		if want := 10*maxConns - (maxConns - 1); int(turned.Load()) < want {
			t.Errorf("%d connections turned away, want at least %d", turned.Load(), want)
		}
	})

	if code := p.stop(t); code != 0 {
		t.Fatalf("exit %d after SIGTERM:\n%s", code, p.output())
	}
}

// dialH2 connects to addr and sends the HTTP/2 preface and an empty
// SETTINGS frame.
func dialH2(t *testing.T, addr string) net.Conn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	b := append([]byte(http2.ClientPreface), 0, 0, 0, byte(http2.FrameSettings), 0, 0, 0, 0, 0)
	if _, err := nc.Write(b); err != nil {
		t.Fatal(err)
	}
	return nc
}

// procRSS returns process pid's resident set in bytes.
func procRSS(t *testing.T, pid int) uint64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// goroutines returns the process's goroutine count, from pprof.
func goroutines(t *testing.T, httpAddr string) int {
	t.Helper()
	resp, err := http.Get("http://" + httpAddr + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	line, _ := bufio.NewReader(resp.Body).ReadString('\n')
	io.Copy(io.Discard, resp.Body)
	n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "goroutine profile: total")))
	if err != nil {
		t.Fatalf("pprof: %q", line)
	}
	return n
}
