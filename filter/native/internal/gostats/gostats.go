// Package gostats measures what the Go runtime costs inside Envoy, for the
// native module's measurements (the probe's, and the sluicetest build of
// libsluice.so): a lock-free histogram of durations, for the time a hook
// takes on a worker thread, and a report of the runtime's own figures.
package gostats

import (
	"encoding/json"
	"math"
	"math/bits"
	"runtime"
	"runtime/metrics"
	"sync/atomic"
	"time"
)

// Histogram counts durations in power-of-two nanosecond buckets, from any
// thread without a lock.
type Histogram struct {
	buckets [64]atomic.Int64
	max     atomic.Int64
}

// Add counts d.
func (h *Histogram) Add(d time.Duration) {
	ns := max(int64(d), 1)
	h.buckets[bits.Len64(uint64(ns))-1].Add(1)
	for {
		m := h.max.Load()
		if ns <= m || h.max.CompareAndSwap(m, ns) {
			return
		}
	}
}

// Quantile returns the upper bound of the bucket holding quantile q.
func (h *Histogram) Quantile(q float64) time.Duration {
	var counts [64]int64
	total := int64(0)
	for i := range h.buckets {
		counts[i] = h.buckets[i].Load()
		total += counts[i]
	}
	if total == 0 {
		return 0
	}
	rank := int64(math.Ceil(q * float64(total)))
	for i, n := range counts {
		rank -= n
		if rank <= 0 {
			return time.Duration(int64(1) << (i + 1))
		}
	}
	return h.Max()
}

// Max returns the longest duration counted.
func (h *Histogram) Max() time.Duration { return time.Duration(h.max.Load()) }

// Report returns, as JSON, what the Go runtime inside Envoy costs: its GC
// cycles and stop-the-world pauses (runtime/metrics), the heap, the
// goroutines, and the time hooks took on the workers (hook_*: p50, p99,
// max, in microseconds).
func Report(hooks *Histogram) []byte {
	samples := []metrics.Sample{
		{Name: "/gc/cycles/total:gc-cycles"},
		{Name: "/sched/pauses/total/gc:seconds"},
		{Name: "/memory/classes/total:bytes"},
		{Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/sched/goroutines:goroutines"},
		{Name: "/sched/gomaxprocs:threads"},
	}
	metrics.Read(samples)
	pauses := samples[1].Value.Float64Histogram()
	report := map[string]any{
		"gc_cycles":          samples[0].Value.Uint64(),
		"gc_pause_count":     histTotal(pauses),
		"gc_pause_p99_us":    histQuantile(pauses, 0.99) * 1e6,
		"gc_pause_max_us":    histMax(pauses) * 1e6,
		"go_memory_bytes":    samples[2].Value.Uint64(),
		"heap_objects_bytes": samples[3].Value.Uint64(),
		"goroutines":         samples[4].Value.Uint64(),
		"gomaxprocs":         samples[5].Value.Uint64(),
		"num_cpu":            runtime.NumCPU(),
		"hook_p50_us":        float64(hooks.Quantile(0.5)) / 1e3,
		"hook_p99_us":        float64(hooks.Quantile(0.99)) / 1e3,
		"hook_max_us":        float64(hooks.Max()) / 1e3,
	}
	b, _ := json.Marshal(report)
	return b
}

// histTotal returns the number of samples of h.
func histTotal(h *metrics.Float64Histogram) uint64 {
	n := uint64(0)
	for _, c := range h.Counts {
		n += c
	}
	return n
}

// histQuantile returns the upper bound of the bucket holding quantile q.
func histQuantile(h *metrics.Float64Histogram, q float64) float64 {
	total := histTotal(h)
	if total == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(total)))
	for i, c := range h.Counts {
		if c >= rank {
			return finite(h.Buckets[i+1], h.Buckets[i])
		}
		rank -= c
	}
	return 0
}

// histMax returns the upper bound of the highest non-empty bucket.
func histMax(h *metrics.Float64Histogram) float64 {
	for i := len(h.Counts) - 1; i >= 0; i-- {
		if h.Counts[i] > 0 {
			return finite(h.Buckets[i+1], h.Buckets[i])
		}
	}
	return 0
}

// finite returns upper, or lower when upper is +Inf (the last bucket).
func finite(upper, lower float64) float64 {
	if math.IsInf(upper, 1) {
		return lower
	}
	return upper
}
