package main

import (
	"slices"
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
