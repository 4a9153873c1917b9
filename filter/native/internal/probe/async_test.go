package main

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// A request held by the request headers hook is resumed from a callout's
// answer: the answer arrives on the stream's worker, is read (status,
// body), and a header set from it reaches the upstream.
func TestPausedRequestResumedFromCallout(t *testing.T) {
	r := get(t, "callout", nil)
	wantOK(t, r)
	wantNotes(t, r, map[string]string{"x-probe-callout": `success 200 "callout answer"`})
	if got := r.echoed.Get("x-callout-status"); got != "200" {
		t.Errorf("upstream saw x-callout-status %q, want 200", got)
	}
	if a, b := tid(t, r, "request-tid"), tid(t, r, "callout-tid"); a != b {
		t.Errorf("callout_done ran on thread %d (%s), the request on %d: want the stream's worker", b, threadName(t, b), a)
	}
}

// A callout to a cluster without hosts fails at once with an error (no
// answer comes later), and the request goes on.
func TestCalloutToEmptyCluster(t *testing.T) {
	r := get(t, "callout-empty", nil)
	wantOK(t, r)
	if got := r.header.Get("x-probe-callout-error"); got == "" {
		t.Errorf("no callout error noted; callout %q", r.header.Get("x-probe-callout"))
	}
}

// A callout that outlives its timeout is answered by Envoy: a 504 with the
// result success (Envoy's own timeout reply), and the request goes on.
func TestCalloutTimeout(t *testing.T) {
	r := get(t, "callout-slow", nil)
	wantOK(t, r)
	if got := r.header.Get("x-probe-callout"); !strings.HasPrefix(got, "success 504 ") {
		t.Errorf("timed-out callout answered %q, want success 504", got)
	}
	if r.elapsed > 5*time.Second {
		t.Errorf("request took %v: the 100 ms timeout did not end the callout", r.elapsed)
	}
}

// The answer of a one-shot callout carries its headers and body, not its
// trailers: a gRPC status sent as a trailer over HTTP/2 does not reach the
// module.
func TestCalloutAnswerHasNoTrailers(t *testing.T) {
	r := get(t, "callout-trailers", nil)
	// No x-probe-callout-grpc-status: the trailer did not reach the module.
	wantNotes(t, r, map[string]string{"x-probe-callout": `success 200 "body before the trailer"`, "x-probe-callout-grpc-status": ""})
}

// A goroutine resumes a held request through the stream's scheduler: the
// function runs on the stream's worker, not on the goroutine's thread.
func TestSchedulerHopFromGoroutine(t *testing.T) {
	for range 20 {
		r := get(t, "hop", nil)
		wantOK(t, r)
		req, hop, g := tid(t, r, "request-tid"), tid(t, r, "hop-tid"), tid(t, r, "goroutine-tid")
		if hop != req {
			t.Fatalf("scheduled function ran on %d (%s), the stream on %d", hop, threadName(t, hop), req)
		}
		if isWorker(t, g) {
			t.Fatalf("the goroutine ran on worker %s: want a thread of the Go runtime", threadName(t, g))
		}
	}
}

// A configuration-level callout (no stream) is made on the main thread and
// answered there; the answer reaches the stream through its scheduler.
func TestConfigCalloutOnMainThread(t *testing.T) {
	r := get(t, "config-callout", nil)
	wantOK(t, r)
	wantNotes(t, r, map[string]string{"x-probe-config-callout-error": "", "x-probe-config-callout": "200"})
	if post, done := tid(t, r, "config-post-tid"), tid(t, r, "config-callout-tid"); post != envoy.PID() || done != envoy.PID() {
		t.Errorf("config scheduler ran on %d, callout answer on %d: want the main thread %d", post, done, envoy.PID())
	}
}

// Several workers change the same Go state: every request is counted once,
// the counter in Envoy's stats agrees, and more than one worker served.
func TestWorkersShareGoState(t *testing.T) {
	before := probeFacts(t)
	statBefore := envoy.Stat("dynamicmodulescustom.probe.requests")
	const n = 400
	results := parallel(t, n, 8, "count")
	seen := map[int]bool{}
	for _, r := range results {
		c, _ := strconv.Atoi(r.header.Get("x-probe-count"))
		if seen[c] {
			t.Fatalf("count %d handed out twice", c)
		}
		seen[c] = true
	}
	after := probeFacts(t)
	if len(after.Workers) < 2 {
		t.Errorf("workers seen %v: want both", after.Workers)
	}
	// probeFacts itself is a request: two of them, counted by the stat.
	if got := envoy.Stat("dynamicmodulescustom.probe.requests") - statBefore; got != n+1 {
		t.Errorf("probe.requests grew by %d, want %d", got, n+1)
	}
	_ = before
	if g := envoy.Stat("dynamicmodulescustom.probe.held"); g != 0 {
		t.Errorf("probe.held = %d after every request ended, want 0", g)
	}
}

// A panic in a hook leaves Envoy serving: the request goes on as if the
// filter were not there; a panic in a callout's answer resumes the held
// request; and the panics were reported.
func TestPanicLeavesEnvoyServing(t *testing.T) {
	before := probeFacts(t).Panics
	for range 5 {
		if r := get(t, "panic-headers", nil); r.status != 200 {
			t.Fatalf("after a panic in request_headers: status %d: %s", r.status, r.body)
		}
		r := get(t, "panic-callout", nil)
		if r.status != 200 {
			t.Fatalf("after a panic in http_callout_done: status %d: %s", r.status, r.body)
		}
		if got := r.echoed.Get("x-callout-status"); got != "" {
			t.Fatalf("the panicking callback's header reached the upstream: %q", got)
		}
	}
	// A panic after a local reply leaves the reply as it was sent.
	if r := get(t, "reply-panic", nil); r.status != 429 || r.body != "replied, then panicked\n" {
		t.Fatalf("a panic after a local reply: status %d, body %q", r.status, r.body)
	}
	if r := get(t, "headers", map[string]string{"x-in": "still"}); r.status != 200 || r.echoed.Get("x-seen") != "still" {
		t.Fatalf("after the panics: status %d, x-seen %q", r.status, r.echoed.Get("x-seen"))
	}
	if got := probeFacts(t).Panics - before; got != 11 {
		t.Errorf("%d panics reported, want 11", got)
	}
	if !strings.Contains(envoy.Log(), "injected panic in http_callout_done") {
		t.Errorf("the recovered panic is not in Envoy's log")
	}
}

// The request body is buffered by the filter and read within a bound.
func TestRequestBodyReadWithinBound(t *testing.T) {
	body := strings.Repeat("x", 5000)
	r := send(t, "POST", "body", map[string]string{"x-limit": "1024"}, strings.NewReader(body))
	wantOK(t, r)
	wantNotes(t, r, map[string]string{"x-probe-body-size": "5000", "x-probe-body-read": "1024", "x-probe-body-whole": "false"})
}
