package main

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tetratelabs/wazero/api"
)

// BenchmarkRequestHeadersPrecheck measures proxy_on_request_headers when
// the precheck decides (a local 429, no call), under wazero's compiler: the
// control plane said the first descriptor is over its limit.
// ns/op covers the whole stream (context create, request headers, done,
// delete); ns/request_headers the proxy_on_request_headers call alone.
func BenchmarkRequestHeadersPrecheck(b *testing.B) {
	benchmarkPrecheck(b, overLimitHost(b, filterWasm))
}

// BenchmarkRequestHeadersPrecheckBucket is BenchmarkRequestHeadersPrecheck
// with the rejection coming from the local token bucket instead.
func BenchmarkRequestHeadersPrecheckBucket(b *testing.B) {
	benchmarkPrecheck(b, emptyBucketHost(b, filterWasm))
}

func benchmarkPrecheck(b *testing.B, h *wasmHost) {
	locals := h.nLocals
	n := streamLoop(b, h)
	if h.nLocals-locals != n {
		b.Fatalf("%d local responses for %d requests", h.nLocals-locals, n)
	}
}

// streamLoop runs b.N streams of benchRequest (context create, request
// headers, done, delete) and reports the time in proxy_on_request_headers.
// It returns b.N.
func streamLoop(b *testing.B, h *wasmHost) int {
	h.quiet = true
	h.headers[100] = benchRequest
	onCreate, onHeaders := h.fn["proxy_on_context_create"], h.fn["proxy_on_request_headers"]
	onDone, onDelete := h.fn["proxy_on_done"], h.fn["proxy_on_delete"]
	stack := h.stack
	var inHeaders time.Duration
	samples := newSampler(b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		h.current = 100
		stack[0], stack[1] = 100, 1
		_ = onCreate.CallWithStack(h.ctx, stack)
		stack[0], stack[1], stack[2] = 100, 4, 1
		start := time.Now()
		_ = onHeaders.CallWithStack(h.ctx, stack)
		d := time.Since(start)
		inHeaders += d
		samples.add(i, d)
		stack[0] = 100
		_ = onDone.CallWithStack(h.ctx, stack)
		stack[0] = 100
		_ = onDelete.CallWithStack(h.ctx, stack)
	}
	b.StopTimer()
	b.ReportMetric(float64(inHeaders.Nanoseconds())/float64(b.N), "ns/request_headers")
	b.ReportMetric(samples.median(), "ns/request_headers_median")
	return b.N
}

// BenchmarkHostCallFloor measures what no implementation of the precheck
// path can avoid under this host: an export that only makes the host calls
// of a precheck rejection (the peer's address, the clock, a counter, the
// local reply). Compare ns/call with BenchmarkRequestHeadersPrecheck's
// ns/request_headers_median.
func BenchmarkHostCallFloor(b *testing.B) {
	h := overLimitHost(b, filterWasmDev)
	h.quiet = true
	h.current = 100
	benchmarkExport(b, h, h.fn["sluice_test_host_floor"], nil, nil)
}

// BenchmarkCallbackCost breaks a precheck rejection's cost down, under
// wazero's compiler, with exports of the sluicetest build: entering the
// guest (bare), the callbacks' frame (frame: arena span and deferred
// guard), each host call of a rejection in that frame (property: the
// peer's address, with proxy_on_memory_allocate called back from inside
// the host call; property_missing: the same host call without the
// allocation; clock; metric; local_response), all of them (floor), the
// host calling proxy_on_memory_allocate directly (allocate), and
// proxy_on_request_headers with the rejection's host calls answered inside
// the guest (guest_only, guest_only_bucket): the guest's own work.
// Compare ns/call_median across them.
func BenchmarkCallbackCost(b *testing.B) {
	for _, name := range []string{"bare", "frame", "property", "property_missing", "clock", "metric", "local_response", "floor"} {
		export := "sluice_test_" + name
		if name == "floor" {
			export = "sluice_test_host_floor"
		}
		b.Run(name, func(b *testing.B) {
			h := overLimitHost(b, filterWasmDev)
			h.quiet = true
			h.current = 100
			benchmarkExport(b, h, h.fn[export], nil, nil)
		})
	}
	b.Run("allocate", func(b *testing.B) {
		h := overLimitHost(b, filterWasmDev)
		// The arena fills up unless a callback resets it now and then.
		benchmarkExport(b, h, h.malloc, []uint64{18}, func() { h.call("sluice_test_frame") })
	})
	for name, newHost := range map[string]func(testing.TB, []byte) *wasmHost{
		"guest_only":        overLimitHost,
		"guest_only_bucket": emptyBucketHost,
	} {
		b.Run(name, func(b *testing.B) {
			h := newHost(b, filterWasmDev)
			h.call("sluice_test_stub_host", 1)
			locals := h.nLocals
			n := streamLoop(b, h)
			if got := h.call("sluice_test_stub_host", 0); got != uint64(n) || h.nLocals != locals {
				b.Fatalf("%d stubbed and %d real local responses for %d requests", got, h.nLocals-locals, n)
			}
		})
	}
}

// benchmarkExport calls f b.N times with args and reports the median call.
// every, if not nil, runs untimed before every 1024th call.
func benchmarkExport(b *testing.B, h *wasmHost, f api.Function, args []uint64, every func()) {
	if f == nil {
		b.Fatal("no such export")
	}
	stack := h.stack
	samples := newSampler(b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if every != nil && i%1024 == 0 {
			b.StopTimer()
			every()
			b.StartTimer()
		}
		copy(stack, args)
		start := time.Now()
		_ = f.CallWithStack(h.ctx, stack)
		samples.add(i, time.Since(start))
	}
	b.StopTimer()
	b.ReportMetric(samples.median(), "ns/call_median")
}

// sampler keeps the durations of up to maxSamples calls spread evenly over
// a benchmark's run, for its median: a median of the first calls alone
// follows whatever else the machine was doing at that moment.
type sampler struct {
	every int // keep call i if i%every == 0
	d     []time.Duration
}

const maxSamples = 8192

func newSampler(n int) *sampler {
	return &sampler{every: max(1, n/maxSamples), d: make([]time.Duration, 0, maxSamples+1)}
}

func (s *sampler) add(i int, d time.Duration) {
	if i%s.every == 0 && len(s.d) < cap(s.d) {
		s.d = append(s.d, d)
	}
}

// median returns the median kept duration in nanoseconds.
func (s *sampler) median() float64 {
	slices.Sort(s.d)
	return float64(s.d[len(s.d)/2].Nanoseconds())
}

// BenchmarkCallout measures a whole stream of a request that calls the
// control plane for a key the precheck has not seen and is admitted, under
// wazero's compiler, over proxy_http_call: request headers (the descriptor,
// the precheck, the shared block, the encoded request), the answer (read,
// decoded, recorded, the RateLimit headers built), response headers, log,
// done, delete. The precheck table is full, as under bench-envoy's spread
// load. ns/op includes this host's side of every host call; ns/request,
// ns/answer, ns/response and ns/end split it by callback (context
// create and request headers; the answer; response headers; log, done and
// delete).
func BenchmarkCallout(b *testing.B) {
	config := strings.Replace(sharedConfig, `"precheck": {"enabled": true}`,
		`"precheck": {"enabled": true, "max_entries": 500}`, 1)
	h := newWasmHostShared(b, b.Context(), filterWasm, config, newHostShared())
	if !h.configure() {
		b.Fatal(h.logs)
	}
	h.quiet = true
	answer := hostAdmittedOne(b)
	users := make([]map[string]string, 2000)
	for i := range users {
		users[i] = map[string]string{":method": "GET", ":path": "/", "x-user": "u" + strconv.Itoa(i)}
	}
	var phases [4]time.Duration // request headers, answer, response headers, the rest
	stream := func(i int) {
		id := uint32(100 + i%2)
		h.headers[id], h.current = users[i%len(users)], id
		t0 := time.Now()
		h.call("proxy_on_context_create", uint64(id), 1)
		h.call("proxy_on_request_headers", uint64(id), 3, 1)
		t1 := time.Now()
		h.deliver(uint32(len(h.calls)), answer)
		t2 := time.Now()
		h.current = id
		h.call("proxy_on_response_headers", uint64(id), 3, 0)
		t3 := time.Now()
		h.call("proxy_on_log", uint64(id))
		h.call("proxy_on_done", uint64(id))
		h.call("proxy_on_delete", uint64(id))
		t4 := time.Now()
		phases[0] += t1.Sub(t0)
		phases[1] += t2.Sub(t1)
		phases[2] += t3.Sub(t2)
		phases[3] += t4.Sub(t3)
	}
	for i := range 3000 { // warm up: the table fills, buffers reach their size
		stream(i)
	}
	calls, resumed := len(h.calls), h.resumed[100]+h.resumed[101]
	phases = [4]time.Duration{}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		stream(3000 + i)
	}
	b.StopTimer()
	for j, unit := range []string{"ns/request", "ns/answer", "ns/response", "ns/end"} {
		b.ReportMetric(float64(phases[j].Nanoseconds())/float64(b.N), unit)
	}
	if c, r := len(h.calls)-calls, h.resumed[100]+h.resumed[101]-resumed; c != b.N || r != b.N {
		b.Fatalf("%d calls, %d resumed for %d requests", c, r, b.N)
	}
}
