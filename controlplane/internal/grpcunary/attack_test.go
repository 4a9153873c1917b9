package grpcunary

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/sluicehq/sluice/controlplane/internal/connbounds"
)

// The tests here attack the decision port to make it hold memory or
// goroutines, each
// bounded in time on loopback. Each checks, through runAttack, that the
// heap stays within a budget, that a normal call from another connection
// succeeds during the attack and after it, and that the goroutines return
// to their baseline; it logs the numbers.

// attackTime bounds each attack.
const attackTime = 3 * time.Second

// report is what runAttack measured.
type report struct {
	heapGrowth uint64        // peak HeapAlloc over the baseline
	rss        uint64        // peak VmRSS of the test process
	callsOK    int           // normal calls that succeeded during the attack
	recovery   time.Duration // from the attack's end to the goroutine baseline
}

// runAttack runs attack (which returns when it is over) against tb and
// checks the bounds above, the heap against budget bytes.
func runAttack(t *testing.T, tb *testbed, budget uint64, attack func()) report {
	t.Helper()
	if _, err := tb.echo(context.Background(), []byte("before")); err != nil {
		t.Fatalf("a call before the attack: %v", err)
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapAlloc
	goroutines := runtime.NumGoroutine()

	var r report
	var peak atomic.Uint64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // the heap and RSS, sampled
		defer wg.Done()
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			if ms.HeapAlloc > base && ms.HeapAlloc-base > peak.Load() {
				peak.Store(ms.HeapAlloc - base)
			}
			r.rss = max(r.rss, rss())
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	var callErr error
	go func() { // normal calls, from another connection, until the attack ends
		defer wg.Done()
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err := tb.echo(ctx, []byte("during"))
			cancel()
			if err != nil {
				callErr = err
				return
			}
			r.callsOK++
			select {
			case <-done:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	attack()
	close(done)
	wg.Wait()
	ended := time.Now()
	r.heapGrowth = peak.Load()
	if callErr != nil {
		t.Errorf("a normal call during the attack failed: %v", callErr)
	}
	if r.callsOK == 0 {
		t.Errorf("no normal call completed during the attack")
	}
	for runtime.NumGoroutine() > goroutines {
		if time.Since(ended) > 5*time.Second {
			t.Errorf("goroutines: %d, %d before the attack", runtime.NumGoroutine(), goroutines)
			break
		}
		time.Sleep(5 * time.Millisecond) // waiting for the server's goroutines to end
	}
	r.recovery = time.Since(ended)
	if _, err := tb.echo(context.Background(), []byte("after")); err != nil {
		t.Errorf("a normal call after the attack: %v", err)
	}
	t.Logf("heap growth %.1f MiB (budget %.0f MiB), peak RSS %.0f MiB, %d normal calls during it, recovery %v",
		mib(r.heapGrowth), mib(budget), mib(r.rss), r.callsOK, r.recovery.Round(time.Millisecond))
	if r.heapGrowth > budget {
		t.Errorf("the heap grew by %.1f MiB, over the budget of %.0f MiB", mib(r.heapGrowth), mib(budget))
	}
	return r
}

func mib(n uint64) float64 { return float64(n) / (1 << 20) }

// rss returns the process's resident set, or 0 where /proc has none.
func rss() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// attacker is a raw connection that writes frames and reads as little as
// it is told to.
type attacker struct {
	nc  net.Conn
	buf []byte
}

// dialAttacker connects with a small receive buffer, and writes the
// preface and an empty SETTINGS unless bare.
func dialAttacker(t *testing.T, addr string, bare bool) *attacker {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	nc.(*net.TCPConn).SetReadBuffer(4 << 10)
	t.Cleanup(func() { nc.Close() })
	a := &attacker{nc: nc}
	if !bare {
		a.buf = append(a.buf, clientPreface...)
		a.buf = appendSettings(a.buf, nil)
	}
	return a
}

// flush writes what is buffered; it reports false once the server has
// closed the connection (or the attack's time is up).
func (a *attacker) flush(until time.Time) bool {
	a.nc.SetWriteDeadline(until)
	_, err := a.nc.Write(a.buf)
	a.buf = a.buf[:0]
	return err == nil
}

// goAway reads until the server's GOAWAY and returns its code, or -1 if
// the connection ended without one.
func (a *attacker) goAway(until time.Time) http2.ErrCode {
	a.nc.SetReadDeadline(until)
	fr := http2.NewFramer(nil, a.nc)
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return ^http2.ErrCode(0)
		}
		if g, ok := f.(*http2.GoAwayFrame); ok {
			return g.ErrCode
		}
	}
}

// neverIndexed HPACK-encodes fields as literals that do not touch the
// dynamic table, so that the block can be sent any number of times.
func neverIndexed(fields []hpack.HeaderField) []byte {
	var b bytes.Buffer
	enc := hpack.NewEncoder(&b)
	for _, f := range fields {
		f.Sensitive = true
		enc.WriteField(f)
	}
	return b.Bytes()
}

// TestAttackControlFrameFlood: a client that sends frames which each need
// an answer (PING, SETTINGS, malformed HEADERS) and never reads made the
// server queue the answers without bound (3 GB in 6 s). Now the queue is
// bounded and the connection ends with GOAWAY ENHANCE_YOUR_CALM.
//
// The promise is that the connection ends, not how fast: a busy machine
// took more than 3 s to read the frames that end it, so the flood may go on
// for floodCloseLimit (an unbounded queue would have long failed the heap
// budget by then).
func TestAttackControlFrameFlood(t *testing.T) {
	const floodCloseLimit = 30 * time.Second
	// A header block of one indexed field, ":method: GET": cheap to send
	// and to decode, and reset (no :path) with a RST_STREAM longer than it.
	bad := []byte{0x82}
	for _, tc := range []struct {
		name  string
		frame func(b []byte, i int) []byte
	}{
		{"PING", func(b []byte, i int) []byte {
			return append(appendFrameHeader(b, 8, http2.FramePing, 0, 0), 1, 2, 3, 4, 5, 6, 7, 8)
		}},
		{"SETTINGS", func(b []byte, i int) []byte { return appendSettings(b, nil) }},
		{"malformed HEADERS", func(b []byte, i int) []byte {
			b = appendFrameHeader(b, len(bad), http2.FrameHeaders, http2.FlagHeadersEndHeaders|http2.FlagHeadersEndStream, uint32(2*i+1))
			return append(b, bad...)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb := newTestbed(t, Options{})
			var frames int
			var lasted time.Duration
			runAttack(t, tb, 64<<20, func() {
				a := dialAttacker(t, tb.addr, false)
				start := time.Now()
				until := start.Add(floodCloseLimit)
				for a.flush(until) {
					for range 1000 {
						a.buf = tc.frame(a.buf, frames)
						frames++
					}
				}
				lasted = time.Since(start)
				a.nc.Close()
			})
			// The GOAWAY (ENHANCE_YOUR_CALM) cannot reach a client that
			// reads nothing: what counts is that the server ended it.
			t.Logf("%d frames sent; the server closed the connection after %v", frames, lasted.Round(time.Millisecond))
			if lasted >= floodCloseLimit {
				t.Errorf("the server did not close the connection within %v", floodCloseLimit)
			}
		})
	}
}

// TestAttackBufferedRequests: streams that send most of a request and
// never end it. A stream could buffer 4 MiB, 1,024 of them per connection,
// on any number of connections. Now a connection holds at most
// MaxConnBufferBytes; a request past it is answered RESOURCE_EXHAUSTED and
// its connection goes on.
func TestAttackBufferedRequests(t *testing.T) {
	// 1 MiB a connection: the four connections' 4 MiB, and the server's
	// own memory, within the heap budget below.
	tb := newTestbed(t, Options{Bounds: connbounds.Bounds{MaxConnBufferBytes: 1 << 20}})
	var refusals map[string]int
	runAttack(t, tb, 24<<20, func() { refusals = holdRequests(t, tb, 4) })
	t.Logf("refusals: %v", refusals)
	if refusals[errConnBudget.Error()] == 0 {
		t.Errorf("want refusals for the connection's budget, got %v", refusals)
	}
	if n := tb.srv.buffered.Load(); n != 0 {
		t.Errorf("the server still counts %d bytes of request buffers", n)
	}
}

// TestServerBufferBudget: connections that each stay within their budget
// cannot together pass MaxBufferBytes. While it is full every request is
// refused (RESOURCE_EXHAUSTED, saying which budget); then calls succeed
// again.
func TestServerBufferBudget(t *testing.T) {
	tb := newTestbed(t, Options{Bounds: connbounds.Bounds{MaxBufferBytes: 2 << 20}})
	refusals := holdRequests(t, tb, 4)
	t.Logf("refusals: %v", refusals)
	if refusals[errConnBudget.Error()] == 0 || refusals[errSrvBudget.Error()] == 0 {
		t.Errorf("want refusals for both budgets, got %v", refusals)
	}
	if _, err := tb.echo(context.Background(), []byte("after")); err != nil {
		t.Fatal(err)
	}
	for len(tb.srv.openConns()) > 1 {
		time.Sleep(time.Millisecond) // the attackers' connections end
	}
	if n := tb.srv.buffered.Load(); n != 0 {
		t.Errorf("the server still counts %d bytes of request buffers", n)
	}
}

// holdRequests opens conns connections that each start 256 calls of
// 60 KiB and send 48 KiB of each; once every connection has sent them, it
// ends the calls and reads the answers. It returns the refusals by reason.
// The connections send in turn, so that the first ones fill their own
// budget before the server's fills: sent at once, they would share the
// server's budget and none might reach its own.
func holdRequests(t *testing.T, tb *testbed, conns int) map[string]int {
	const streams, msg = 256, 60 << 10
	block := neverIndexed(request("/test.Echo/Echo"))
	prefix := []byte{0, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(prefix[1:], msg)
	part := make([]byte, 16<<10) // one DATA frame's worth
	refusals := map[string]int{}
	var mu sync.Mutex
	var wg, held sync.WaitGroup
	held.Add(conns)
	turn := make(chan struct{})
	close(turn)
	for range conns {
		mine, next := turn, make(chan struct{})
		turn = next
		a := dialAttacker(t, tb.addr, false)
		a.buf = appendWindowUpdate(a.buf, 0, 1<<30)
		until := time.Now().Add(attackTime)
		wg.Add(2)
		go func() { // read the answers, so that the server can write them
			defer wg.Done()
			got := readRefusals(a.nc, streams, until)
			mu.Lock()
			for m, n := range got {
				refusals[m] += n
			}
			mu.Unlock()
			a.nc.Close()
		}()
		go func() {
			defer wg.Done()
			<-mine
			for i := range streams {
				id := uint32(2*i + 1)
				a.buf = appendFrameHeader(a.buf, len(block), http2.FrameHeaders, http2.FlagHeadersEndHeaders, id)
				a.buf = append(a.buf, block...)
				for n := 0; n < msg-len(part); n += len(part) {
					data := part
					if n == 0 {
						data = append(bytes.Clone(prefix), part[5:]...)
					}
					a.buf = appendFrameHeader(a.buf, len(data), http2.FrameData, 0, id)
					a.buf = append(a.buf, data...)
				}
				if !a.flush(until) {
					t.Errorf("the server closed a connection after %d streams", i)
					break
				}
			}
			close(next)
			held.Done()
			held.Wait() // every connection holds what it can
			// End every request: the ones held are answered (their
			// message is short), the refused ones were reset.
			for i := range streams {
				a.buf = appendFrameHeader(a.buf, 0, http2.FrameData, http2.FlagDataEndStream, uint32(2*i+1))
			}
			a.flush(until)
		}()
	}
	wg.Wait()
	return refusals
}

// readRefusals reads answers on nc until n streams have ended (answered
// or reset) or until, and counts the grpc-messages of the refusals by
// their reason.
func readRefusals(nc net.Conn, n int, until time.Time) map[string]int {
	nc.SetReadDeadline(until)
	fr := http2.NewFramer(nil, nc)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	got := map[string]int{}
	for ended := 0; ended < n; {
		f, err := fr.ReadFrame()
		if err != nil {
			return got
		}
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			if m := f.PseudoValue("status"); m != "" && f.StreamEnded() {
				msg := decodeMessage(headerValue(f, "grpc-message"))
				for _, why := range []error{errConnBudget, errSrvBudget} {
					if strings.Contains(msg, why.Error()) && headerValue(f, "grpc-status") == "8" {
						got[why.Error()]++
					}
				}
				ended++
			}
		case *http2.RSTStreamFrame:
		}
	}
	return got
}

func headerValue(f *http2.MetaHeadersFrame, name string) string {
	for _, hf := range f.RegularFields() {
		if hf.Name == name {
			return hf.Value
		}
	}
	return ""
}

// decodeMessage undoes grpc-message's percent-encoding.
func decodeMessage(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+3], 16, 8); err == nil {
				b.WriteByte(byte(v))
				i += 2
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// TestAttackContinuationFlood: a header block that never ends, in empty
// CONTINUATION frames, was read forever. Now its 17th CONTINUATION ends
// the connection with GOAWAY ENHANCE_YOUR_CALM.
func TestAttackContinuationFlood(t *testing.T) {
	tb := newTestbed(t, Options{})
	var sent int
	var code http2.ErrCode
	runAttack(t, tb, 16<<20, func() {
		a := dialAttacker(t, tb.addr, false)
		block := neverIndexed(request("/test.Echo/Echo"))
		a.buf = appendFrameHeader(a.buf, len(block), http2.FrameHeaders, 0, 1)
		a.buf = append(a.buf, block...)
		until := time.Now().Add(attackTime)
		for a.flush(until) {
			for range 1000 {
				a.buf = appendFrameHeader(a.buf, 0, http2.FrameContinuation, 0, 1)
				sent++
			}
		}
		code = a.goAway(time.Now().Add(attackTime))
		a.nc.Close()
	})
	t.Logf("%d CONTINUATION frames sent; GOAWAY %v", sent, code)
	if code != http2.ErrCodeEnhanceYourCalm {
		t.Errorf("GOAWAY %v, want ENHANCE_YOUR_CALM", code)
	}
}

// TestAttackRapidReset: streams opened and reset at once (CVE-2023-44487)
// were decided anyway: 4.25M decisions in 10 s from 4 connections. Now a
// call reset before it starts is not decided, and a connection whose
// client resets most streams early is sent GOAWAY ENHANCE_YOUR_CALM.
func TestAttackRapidReset(t *testing.T) {
	const conns = 4
	tb := newTestbed(t, Options{})
	block := neverIndexed(request("/test.Echo/Batch"))
	body := echoBody(t, []byte("rapid"))
	var sent atomic.Int64
	codes := make([]http2.ErrCode, conns)
	before := tb.decided()
	runAttack(t, tb, 32<<20, func() {
		var wg sync.WaitGroup
		for i := range conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				a := dialAttacker(t, tb.addr, false)
				until := time.Now().Add(attackTime)
				id := uint32(1)
				for a.flush(until) && id < 1<<30 {
					for range 100 {
						a.buf = appendFrameHeader(a.buf, len(block), http2.FrameHeaders, http2.FlagHeadersEndHeaders, id)
						a.buf = append(a.buf, block...)
						a.buf = appendFrameHeader(a.buf, len(body), http2.FrameData, http2.FlagDataEndStream, id)
						a.buf = append(a.buf, body...)
						a.buf = appendRSTStream(a.buf, id, http2.ErrCodeCancel)
						id += 2
						sent.Add(1)
					}
				}
				codes[i] = a.goAway(time.Now().Add(attackTime))
				a.nc.Close()
			}()
		}
		wg.Wait()
	})
	decided := tb.decided() - before
	t.Logf("%d streams opened and reset, %d decided; GOAWAYs %v", sent.Load(), decided, codes)
	if decided*20 > int(sent.Load()) {
		t.Errorf("%d of %d reset calls were decided", decided, sent.Load())
	}
	for _, code := range codes {
		if code != http2.ErrCodeEnhanceYourCalm {
			t.Errorf("GOAWAY %v, want ENHANCE_YOUR_CALM", code)
		}
	}
}

// decided returns how many calls the batch method has decided.
func (tb *testbed) decided() int {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	n := 0
	for _, b := range tb.batches {
		n += b
	}
	return n
}

// TestCurlUnknownMethod: curl 7.88 failed 14 calls of 100 to an unknown
// method with error 92, for the RST_STREAM NO_ERROR that followed the
// answer. Now the answer waits for the request's end, and none fails.
func TestCurlUnknownMethod(t *testing.T) {
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Skip("no curl")
	}
	tb := newTestbed(t, Options{})
	body := filepath.Join(t.TempDir(), "body")
	if err := os.WriteFile(body, echoBody(t, []byte("hello")), 0o600); err != nil {
		t.Fatal(err)
	}
	failed := map[int]int{}
	const calls = 100
	for range calls {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		cmd := exec.CommandContext(ctx, curl, "-sS", "--http2-prior-knowledge", "-o", "/dev/null",
			"-H", "content-type: application/grpc", "-H", "te: trailers", "--data-binary", "@"+body,
			"http://"+tb.addr+"/test.Echo/Nope")
		err := cmd.Run()
		cancel()
		var ee *exec.ExitError
		switch {
		case errors.As(err, &ee):
			failed[ee.ExitCode()]++
		case err != nil:
			t.Fatal(err)
		}
	}
	t.Logf("%d curl calls, failures by exit code: %v", calls, failed)
	if len(failed) > 0 {
		t.Errorf("curl failed: %v (exit code: count)", failed)
	}
}
