package main

import (
	"math/bits"
	"time"
)

// subBits is the number of mantissa bits kept per power of two: 32 buckets
// per doubling, so a bucket spans at most 1/32 (about 3%) of its values.
const subBits = 5

// buckets covers every positive int64 of nanoseconds.
const buckets = (64 - subBits + 1) << subBits

// histogram counts durations in log-linear buckets: fixed memory whatever
// the run's length, and quantiles within about 3%.
type histogram struct {
	counts [buckets]uint64
	n      uint64
	max    time.Duration
}

// bucketOf returns the bucket of v >= 0: values below 2^subBits have their
// own bucket; above, a bucket is a power of two and the subBits bits after
// its leading one.
func bucketOf(v uint64) int {
	if v < 1<<subBits {
		return int(v)
	}
	e := bits.Len64(v) - 1 // position of the leading one, >= subBits
	return (e-subBits+1)<<subBits | int(v>>(e-subBits)&(1<<subBits-1))
}

// bounds returns the smallest value of bucket i and the first value above it.
func bounds(i int) (lo, hi uint64) {
	if i < 1<<subBits {
		return uint64(i), uint64(i) + 1
	}
	e := i>>subBits + subBits - 1
	m := uint64(i & (1<<subBits - 1))
	lo = 1<<e | m<<(e-subBits)
	return lo, lo + 1<<(e-subBits)
}

// record adds one duration.
func (h *histogram) record(d time.Duration) {
	if d < 0 {
		d = 0
	}
	h.counts[bucketOf(uint64(d))]++
	h.n++
	h.max = max(h.max, d)
}

// merge adds o's counts to h.
func (h *histogram) merge(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.max = max(h.max, o.max)
}

// quantile returns the q-quantile (0 < q <= 1): the middle of the bucket
// holding the ceil(q*n)-th smallest value, capped at the maximum seen; 0
// when empty.
func (h *histogram) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(q * float64(h.n))
	if float64(rank) < q*float64(h.n) {
		rank++
	}
	rank = max(rank, 1)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			lo, hi := bounds(i)
			return min(time.Duration(lo+(hi-lo)/2), h.max)
		}
	}
	return h.max
}
