// Package usage tests usage-based limits through the filter on real Envoy:
// the filter asks a reserve at request time and settles the
// cost the response reports (a header, or the trailer of a streamed
// response) at its end; the control plane charges each settlement exactly
// once, past the limit if need be.
package usage

import (
	"context"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/e2e/stack"
)

// The filter's counters (SETTLE-CONTRACT.md).
const (
	statSettled     = "sluice.usage_settled"
	statCalls       = "sluice.usage_settle_calls"
	statRetries     = "sluice.usage_settle_retries"
	statLost        = "sluice.usage_settle_lost"
	statDisconnects = "sluice.usage_disconnects"
)

// settleWait bounds how long a test waits for settlements to be
// acknowledged (the default interval is 100 ms; the machine is busy).
const settleWait = 30 * time.Second

// TestUsageEnvoy runs every usage scenario on one stack (one Envoy: V8
// compiles filter.wasm once). The subtests use keys of their own and run
// one after the other, so that each reads the filter's counters alone.
func TestUsageEnvoy(t *testing.T) {
	stack.ForEachFilter(t, filters, func(t *testing.T, f stack.Filter) {
		if untilMidnight(time.Now()) < 10*time.Minute {
			t.Skip("within 10 minutes of UTC midnight: the day windows would reset mid-test")
		}
		e := startEnv(t, f)
		t.Run("minute/header", func(t *testing.T) { testMinute(t, e, lnHeader, "header") })
		t.Run("minute/trailer", func(t *testing.T) { testMinute(t, e, lnTrailer, "trailer") })
		t.Run("exact", func(t *testing.T) { testExact(t, e) })
		t.Run("overshoot", func(t *testing.T) { testOvershoot(t, e) })
		t.Run("killed", func(t *testing.T) { testKilled(t, e) })
		t.Run("frozen", func(t *testing.T) { testFrozen(t, e) })
		t.Run("disconnect/bytes", func(t *testing.T) { testDisconnect(t, e, lnDiscBytes, "bytes") })
		t.Run("disconnect/reserve", func(t *testing.T) { testDisconnect(t, e, lnDiscReserve, "reserve") })
	})
}

// minuteStep is one request of testMinute and what it saw.
type minuteStep struct {
	status        int
	remaining     int64 // the RateLimit header's r (-1 without)
	retryAfter    string
	before, after time.Time // around the request
}

// testMinute: 250 tokens a minute, reserve 0 (a pure check), each request
// uses 100. Requests 1 to 3 pass with RateLimit remaining 250, 150, 50 (each
// waits until the previous one's settlement is acknowledged); the fourth
// gets 429 with a Retry-After that is the time until the minute window
// ends. The windows are aligned to the clock; when the four requests
// straddle a boundary, the scenario runs again on a fresh key.
func testMinute(t *testing.T, e *env, ln, mode string) {
	for attempt := 1; ; attempt++ {
		key := freshKey("minute-" + mode)
		start := time.Now()
		steps := e.runMinute(t, ln, mode, key)
		end := time.Now()
		if start.Unix()/60 != end.Unix()/60 {
			if attempt == 3 {
				t.Fatalf("three attempts straddled a minute boundary: the machine is too slow for this test")
			}
			t.Logf("attempt %d straddled a minute boundary (%s to %s): again on a fresh key", attempt, start.Format(time.TimeOnly), end.Format(time.TimeOnly))
			continue
		}
		for i, want := range []int64{250, 150, 50} {
			if s := steps[i]; s.status != 200 || s.remaining != want {
				t.Errorf("request %d: status %d, RateLimit remaining %d; want 200, %d", i+1, s.status, s.remaining, want)
			}
		}
		s := steps[3]
		windowEnd := time.Unix((start.Unix()/60+1)*60, 0)
		// Retry-After is whole seconds: from the time left when the answer
		// arrived, rounded down, to the time left when it was sent,
		// rounded up.
		lo, hi := int64(windowEnd.Sub(s.after)/time.Second), int64(math.Ceil(windowEnd.Sub(s.before).Seconds()))
		ra, err := strconv.ParseInt(s.retryAfter, 10, 64)
		if s.status != 429 || err != nil || ra < lo || ra > hi {
			t.Errorf("request 4: status %d, Retry-After %q; want 429 and %d..%d s (until the window ends at %s)",
				s.status, s.retryAfter, lo, hi, windowEnd.Format(time.TimeOnly))
		}
		if s.remaining != 0 {
			t.Errorf("request 4: RateLimit remaining %d, want 0", s.remaining)
		}
		if got := e.up.Reported(key); got != 300 {
			t.Errorf("the upstream reported %d tokens for the key, want 300 (three requests)", got)
		}
		t.Logf("%s: remaining %d, %d, %d; then %d with Retry-After %s s (window ends in %d..%d s)",
			mode, steps[0].remaining, steps[1].remaining, steps[2].remaining, s.status, s.retryAfter, lo, hi)
		return
	}
}

// runMinute sends testMinute's four requests for key through ln.
func (e *env) runMinute(t *testing.T, ln, mode, key string) []minuteStep {
	t.Helper()
	var steps []minuteStep
	for i := range 4 {
		s := minuteStep{before: time.Now()}
		resp, err := e.client.Do(e.newRequest(context.Background(), ln, request{key: key, tokens: 100, mode: mode}))
		if err != nil {
			t.Fatalf("request %d: %v", i+1, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		s.after = time.Now()
		s.status, s.retryAfter = resp.StatusCode, resp.Header.Get("Retry-After")
		s.remaining = remaining(resp.Header.Get("RateLimit"))
		steps = append(steps, s)
		if s.status == 200 {
			// Until its settlement is charged: a probe shows the limit
			// minus the usage so far (0 remaining once past it).
			want := min(int64(100*(i+1)), minuteLimit)
			if got := e.waitCharged(t, cpMemory, "api_key", key, minuteLimit, want, settleWait); got != want {
				if time.Now().Unix()/60 != steps[0].before.Unix()/60 {
					return steps // a new window counts from 0: the caller sees the boundary and runs again
				}
				t.Fatalf("request %d: charged %d within %v of its end, want %d", i+1, got, settleWait, want)
			}
		}
	}
	return steps
}

// remaining returns the r parameter of a RateLimit field (draft 10:
// `"name";r=50;t=30`), or -1.
func remaining(field string) int64 { return rateLimitParam(field, "r") }

// rateLimitParam returns parameter name of a RateLimit field, or -1.
func rateLimitParam(field, name string) int64 {
	for _, p := range strings.Split(field, ";") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(p), name+"="); ok {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				return n
			}
		}
	}
	return -1
}

// answer is one request of a burst as the client saw it.
type answer = stack.BurstAnswer

// burst sends reqs through ln at once (one goroutine and connection each),
// all held by the upstream on gate after their first chunk. Once every
// request is decided (the client has its status: the admitted ones are then
// all streaming at the same time), it calls decided, releases the gate and
// returns the answers once every body is read.
func (e *env) burst(t *testing.T, ln, gate string, reqs []request, decided func([]answer)) []answer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out := stack.Burst(ctx, len(reqs), func(ctx context.Context, i int) (*http.Response, error) {
		r := reqs[i]
		r.hold = gate
		return e.client.Do(e.newRequest(ctx, ln, r))
	}, false, decided, func() { e.up.Release(gate) })
	for i, a := range out {
		if a.Err != nil {
			t.Fatalf("request %d: %v", i, a.Err)
		}
	}
	return out
}

// testExact: 64 concurrent streaming requests on one key (Redis, reserve
// 0, usage in the trailer): once their settlements are acknowledged, the
// control plane's charged total is exactly the usage the upstream
// reported.
func testExact(t *testing.T, e *env) {
	const n = 64
	key := freshKey("exact")
	reqs := make([]request, n)
	var want int64
	for i := range reqs {
		reqs[i] = request{key: key, tokens: 1 + (i*37)%200, mode: "trailer"}
		want += int64(reqs[i].tokens)
	}
	settled, lost, calls := e.filterStat(statSettled), e.filterStat(statLost), e.filterStat(statCalls)
	out := e.burst(t, lnExact, key, reqs, func([]answer) {
		if got := e.up.Requests(key); got != n {
			t.Errorf("%d requests streaming at once at the upstream, want %d", got, n)
		}
	})
	for i, a := range out {
		if a.Status != 200 {
			t.Fatalf("request %d: status %d, want 200 (the limit is never reached)", i, a.Status)
		}
	}
	reported := e.up.Reported(key)
	charged := e.waitCharged(t, cpRedis, "exact_key", key, exactLimit, reported, settleWait)
	nSettled, nLost, nCalls := e.filterStat(statSettled)-settled, e.filterStat(statLost)-lost, e.filterStat(statCalls)-calls
	if reported != want || charged != reported || nLost != 0 {
		t.Errorf("charged %d, the upstream reported %d (asked %d), %d charges lost: want them equal, none lost", charged, reported, want, nLost)
	}
	t.Logf("64 concurrent streams: the upstream reported %d tokens, the control plane charged %d; the filter merged them into %d charges of the key, in %d settle calls",
		reported, charged, nSettled, nCalls)
}

// testOvershoot runs one token workload through the filter (reserve 100
// per request) and through Envoy's ratelimit filter with
// apply_on_stream_done (Envoy Gateway's response cost: a pure check at
// request time, the usage at stream end), each on a fresh key of 1000
// tokens a day: 64 requests at once, each using 50 to 150 tokens, all
// streaming until every one is decided. Envoy's path admits every request
// that starts while something remains; ours admits at most limit/reserve,
// so the admitted usage stays within the limit plus the usage of the
// admitted requests beyond their reserves (the stated bound).
func testOvershoot(t *testing.T, e *env) {
	const n = 64
	type result struct {
		admitted          int
		usage, bound      int64
		overshoot         int64
		refused, failures int
	}
	run := func(ln string) result {
		key := freshKey("overshoot-" + ln)
		reqs := make([]request, n)
		for i := range reqs {
			reqs[i] = request{key: key, tokens: 50 + (i*37)%101, mode: "header"}
		}
		out := e.burst(t, ln, key, reqs, nil)
		var r result
		r.bound = boundLimit
		for i, a := range out {
			switch a.Status {
			case 200:
				r.admitted++
				r.bound += int64(max(0, reqs[i].tokens-boundReserve))
			case 429:
				r.refused++
			default:
				r.failures++
			}
		}
		r.usage = e.up.Reported(key)
		r.overshoot = r.usage - boundLimit
		return r
	}
	ours, envoyRL := run(lnBound), run(lnEnvoyRL)
	t.Logf("64 concurrent requests of 50..150 tokens, a limit of %d tokens:", boundLimit)
	t.Logf("%-44s %8s %8s %13s %9s %s", "path", "admitted", "refused", "admitted use", "overshoot", "stated bound")
	t.Logf("%-44s %8d %8d %13d %9d %d (limit + use beyond the reserves)", "sluice filter, reserve 100, settle at end", ours.admitted, ours.refused, ours.usage, ours.overshoot, ours.bound)
	t.Logf("%-44s %8d %8d %13d %9d %s", "Envoy ratelimit, apply_on_stream_done", envoyRL.admitted, envoyRL.refused, envoyRL.usage, envoyRL.overshoot, "none")
	if ours.failures+envoyRL.failures != 0 {
		t.Errorf("answers other than 200 and 429: %d (ours), %d (Envoy's filter)", ours.failures, envoyRL.failures)
	}
	if ours.admitted == 0 || ours.admitted > boundLimit/boundReserve {
		t.Errorf("ours admitted %d requests at once, want 1..%d (each reserves %d of %d)", ours.admitted, boundLimit/boundReserve, boundReserve, boundLimit)
	}
	if ours.usage > ours.bound {
		t.Errorf("ours: admitted usage %d, past the stated bound %d", ours.usage, ours.bound)
	}
	if envoyRL.admitted == 0 {
		t.Errorf("Envoy's filter admitted nothing: the comparison ran on a broken configuration")
	}
}

// testKilled: 48 streams admitted, each on a key of its own (reserve 0,
// trailer), then the control plane is killed (SIGKILL, by PID) and the
// streams end: their charges cannot be delivered and wait in the VMs'
// settlement queues, which hold at most 2 x queue_max each (queue_max
// waiting, queue_max in batches); past that they are lost, and counted. The
// control plane restarts on the same port and Redis: the charges held are
// delivered, and the charged total is what the upstream reported minus the
// lost charges' usage.
func testKilled(t *testing.T, e *env) {
	const n, tokens = 48, 10
	base := freshKey("killed")
	reqs := make([]request, n)
	for i := range reqs {
		reqs[i] = request{key: base + "-" + strconv.Itoa(i), tokens: tokens, mode: "trailer"}
	}
	lost, retries := e.filterStat(statLost), e.filterStat(statRetries)
	cp := e.cps[cpKill]
	out := e.burst(t, lnKill, base, reqs, func(out []answer) {
		for i, a := range out {
			if a.Status != 200 {
				t.Fatalf("request %d: status %d before the kill, want 200", i, a.Status)
			}
		}
		pid := cp.PID()
		cp.Kill()
		t.Logf("control plane (pid %d) killed with %d streams in flight", pid, n)
	})
	for i, a := range out {
		if a.Status != 200 {
			t.Fatalf("request %d: status %d, want 200", i, a.Status)
		}
	}
	if got := e.waitStat(statRetries, retries+1, settleWait); got <= retries {
		t.Errorf("no settle call was retried while the control plane was down (%s %d)", statRetries, got)
	}
	if err := cp.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The restarted process counts from 0 the charges it applied; it
	// serves only this listener.
	var nApplied, nLost int64
	for deadline := time.Now().Add(settleWait); ; time.Sleep(50 * time.Millisecond) {
		nApplied = int64(e.cpMetric(t, cpKill, "sluice_settlements_total", "result", "applied"))
		nLost = e.filterStat(statLost) - lost
		if nApplied+nLost >= n || time.Now().After(deadline) {
			break
		}
	}
	var reported, charged, zero int64
	for _, r := range reqs {
		reported += e.up.Reported(r.key)
		c := e.charged(t, cpKill, "exact_key", r.key, exactLimit)
		charged += c
		if c == 0 {
			zero++
		}
	}
	held := int64(workers * 2 * killQueueMax)
	t.Logf("after the restart: %d charges delivered, %d lost (queue_max %d: at most %d held in %d VMs), %d retries; reported %d, charged %d",
		nApplied, nLost, killQueueMax, held, workers, e.filterStat(statRetries)-retries, reported, charged)
	if nApplied+nLost != n {
		t.Fatalf("%d delivered + %d lost within %v of the restart, want %d", nApplied, nLost, settleWait, n)
	}
	if nApplied == 0 || nApplied > held {
		t.Errorf("%d charges delivered after the control plane returned, want 1..%d (what the queues hold)", nApplied, held)
	}
	if nLost < n-held {
		t.Errorf("%d charges lost, want at least %d: the queues hold at most %d", nLost, n-held, held)
	}
	if reported != n*tokens || charged != reported-nLost*tokens || zero != nLost {
		t.Errorf("charged %d (%d keys charged nothing), want reported %d - lost %d x %d = %d", charged, zero, reported, nLost, tokens, reported-nLost*tokens)
	}
}

// testFrozen: 8 streams end while the control plane is frozen (SIGSTOP:
// its sockets accept, nothing answers), so each settle call times out
// (timeout_ms 500) and is sent again with the same token; the control plane
// then thaws and may apply a call the filter has given up on, then its
// retry. Each key is charged its usage exactly once.
func testFrozen(t *testing.T, e *env) {
	const n, tokens = 8, 10
	base := freshKey("frozen")
	reqs := make([]request, n)
	for i := range reqs {
		reqs[i] = request{key: base + "-" + strconv.Itoa(i), tokens: tokens + i, mode: "trailer"}
	}
	lost, retries := e.filterStat(statLost), e.filterStat(statRetries)
	cp := e.cps[cpKill]
	applied0 := e.cpMetric(t, cpKill, "sluice_settlements_total", "result", "applied")
	dup0 := e.cpMetric(t, cpKill, "sluice_settlements_total", "result", "duplicate")
	e.burst(t, lnKill, base, reqs, func(out []answer) {
		for i, a := range out {
			if a.Status != 200 {
				t.Fatalf("request %d: status %d before the freeze, want 200", i, a.Status)
			}
		}
		if err := cp.Freeze(); err != nil {
			t.Fatal(err)
		}
	})
	got := e.waitStat(statRetries, retries+2, settleWait)
	if err := cp.Thaw(); err != nil {
		t.Fatal(err)
	}
	if got < retries+2 {
		t.Fatalf("%s went from %d to %d while the control plane was frozen, want 2 retries at least", statRetries, retries, got)
	}
	for _, r := range reqs {
		if c := e.waitCharged(t, cpKill, "exact_key", r.key, exactLimit, int64(r.tokens), settleWait); c != int64(r.tokens) || e.up.Reported(r.key) != int64(r.tokens) {
			t.Errorf("key %s: charged %d, the upstream reported %d", r.key, c, e.up.Reported(r.key))
		}
	}
	if l := e.filterStat(statLost) - lost; l != 0 {
		t.Errorf("%d charges lost", l)
	}
	t.Logf("frozen: %d retries; the control plane applied %v charges and answered %v duplicates; each of %d keys charged its usage once",
		e.filterStat(statRetries)-retries, e.cpMetric(t, cpKill, "sluice_settlements_total", "result", "applied")-applied0,
		e.cpMetric(t, cpKill, "sluice_settlements_total", "result", "duplicate")-dup0, n)
}

// testDisconnect: a client reads the first chunk of a streamed response,
// then closes its connection. The filter charges what on_disconnect says:
// "bytes", the response body bytes sent so far (the one chunk); "reserve",
// the reserve taken at request time and nothing more. The upstream never
// sent its trailer. A later request on the key is charged as usual.
func testDisconnect(t *testing.T, e *env, ln, onDisconnect string) {
	key := freshKey("disconnect-" + onDisconnect)
	want := int64(stack.UsageChunk)
	if onDisconnect == "reserve" {
		want = discReserve
	}
	disconnects, canceled := e.filterStat(statDisconnects), e.up.Canceled()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(e.newRequest(ctx, ln, request{key: key, tokens: 500, mode: "trailer", hold: key}))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("status %d, want 200", resp.StatusCode)
	}
	if _, err := io.ReadFull(resp.Body, make([]byte, stack.UsageChunk)); err != nil {
		t.Fatalf("reading the first chunk: %v", err)
	}
	cancel() // closes the connection mid-stream
	resp.Body.Close()

	for deadline := time.Now().Add(settleWait); e.up.Canceled() == canceled; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("Envoy did not reset the upstream stream within %v of the client's disconnect", settleWait)
		}
	}
	e.up.Release(key)
	if got := e.waitStat(statDisconnects, disconnects+1, settleWait); got != disconnects+1 {
		t.Errorf("%s went from %d to %d, want one more", statDisconnects, disconnects, got)
	}
	if got := e.waitCharged(t, cpMemory, "disc_key", key, discLimit, want, settleWait); got != want {
		t.Errorf("on_disconnect %s: charged %d, want %d", onDisconnect, got, want)
	}
	if got := e.up.Reported(key); got != 0 {
		t.Errorf("the upstream reported %d tokens for a stream it never finished", got)
	}

	// Nothing is left held: no stream open in Envoy, downstream or
	// upstream, and no request held by the filter.
	gauges := []string{"http." + ln + ".downstream_rq_active", "cluster.up.upstream_rq_active", e.filter.Stat("sluice.held")}
	for deadline := time.Now().Add(settleWait); ; time.Sleep(20 * time.Millisecond) {
		var open []string
		for _, g := range gauges {
			if v := e.envoy.Stat(g); v != 0 {
				open = append(open, g+"="+strconv.FormatInt(v, 10))
			}
		}
		if len(open) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v after the disconnect: %v", settleWait, open)
		}
	}

	// A later request on the key: charged its usage (beyond its reserve).
	later, err := e.client.Do(e.newRequest(context.Background(), ln, request{key: key, tokens: 20, mode: "trailer"}))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, later.Body)
	later.Body.Close()
	if later.StatusCode != 200 {
		t.Fatalf("the request after the disconnect: status %d, want 200", later.StatusCode)
	}
	if got := e.waitCharged(t, cpMemory, "disc_key", key, discLimit, want+20, settleWait); got != want+20 {
		t.Errorf("after a request of 20 tokens: charged %d, want %d", got, want+20)
	}
}
