package rlqs

import (
	"math"
	"testing"
	"time"
)

func TestBucketFor(t *testing.T) {
	tests := []struct {
		share float64
		want  TokenBucket
	}{
		{0, TokenBucket{}},
		{-1, TokenBucket{}},
		{math.NaN(), TokenBucket{}},
		{100, TokenBucket{MaxTokens: 100, TokensPerFill: 100, FillInterval: time.Second}},
		{39.105, TokenBucket{MaxTokens: 39, TokensPerFill: 39, FillInterval: time.Second}},
		{22, TokenBucket{MaxTokens: 22, TokensPerFill: 22, FillInterval: time.Second}},
		{22.5, TokenBucket{MaxTokens: 45, TokensPerFill: 45, FillInterval: 2 * time.Second}},  // 22 would be 2.2% short
		{38.99, TokenBucket{MaxTokens: 77, TokensPerFill: 77, FillInterval: 2 * time.Second}}, // 38 would be 2.5% short
		{1.9, TokenBucket{MaxTokens: 15, TokensPerFill: 15, FillInterval: 8 * time.Second}},   // the first interval within 2%
		{1.5, TokenBucket{MaxTokens: 3, TokensPerFill: 3, FillInterval: 2 * time.Second}},
		{0.5, TokenBucket{MaxTokens: 1, TokensPerFill: 1, FillInterval: 2 * time.Second}},
		{1.0 / 60, TokenBucket{MaxTokens: 1, TokensPerFill: 1, FillInterval: time.Minute}}, // 1 a minute
		{0.3, TokenBucket{MaxTokens: 3, TokensPerFill: 3, FillInterval: 10 * time.Second}},
		{0.0015, TokenBucket{MaxTokens: 1, TokensPerFill: 1, FillInterval: 667 * time.Second}},
		{1e-4, TokenBucket{MaxTokens: 1, TokensPerFill: 1, FillInterval: maxFillInterval}},
		{1e-5, TokenBucket{}}, // below one token per maxFillInterval: deny all
		{1e12, TokenBucket{MaxTokens: math.MaxUint32, TokensPerFill: math.MaxUint32, FillInterval: time.Second}},
	}
	for _, tt := range tests {
		if got := BucketFor(tt.share); got != tt.want {
			t.Errorf("BucketFor(%v) = %+v, want %+v", tt.share, got, tt.want)
		}
	}
}

// envoyRate is the rate Envoy's rate_limit_quota filter admits under a
// bucket, saturated: it refills continuously at tokens_per_fill over the
// fill interval truncated to whole seconds (dividing by zero below 1 s).
func envoyRate(b TokenBucket) float64 {
	sec := math.Trunc(b.FillInterval.Seconds())
	return float64(b.TokensPerFill) / sec
}

// literalRate is what a client that reads token_bucket.proto literally
// admits under a bucket, saturated, over n fill intervals after its first
// full bucket is spent: tokens_per_fill are added once each fill interval,
// and the bucket never holds more than max_tokens. Simulated fill by fill.
func literalRate(b TokenBucket, n int) float64 {
	held := 0.0 // the client has just spent the bucket's first fill
	admitted := 0.0
	for range n {
		held = min(held+float64(b.TokensPerFill), float64(b.MaxTokens))
		admitted += held // it sends every request it can
		held = 0
	}
	return admitted / (float64(n) * b.FillInterval.Seconds())
}

// TestBucketBothReadings: for shares from 1e-4 to 1e6 requests a second,
// the bucket admits the share under both readings of token_bucket.proto
// (Envoy's continuous refill, a literal client's fill per interval), never
// more, at most maxShortfall less; whole-second intervals, tokens_per_fill
// no more than max_tokens, the burst no larger than needed.
func TestBucketBothReadings(t *testing.T) {
	for e := -4.0; e <= 6; e += 0.001 {
		share := math.Pow(10, e)
		b := BucketFor(share)
		if b.TokensPerFill == 0 {
			t.Fatalf("BucketFor(%v) denies all", share)
		}
		if b.FillInterval%time.Second != 0 || b.FillInterval < time.Second || b.FillInterval > maxFillInterval {
			t.Fatalf("BucketFor(%v) = %+v: fill interval not whole seconds from 1 s to %v", share, b, maxFillInterval)
		}
		if b.TokensPerFill > b.MaxTokens {
			t.Fatalf("BucketFor(%v) = %+v: tokens_per_fill above max_tokens, a literal client loses the excess", share, b)
		}
		least := share * (1 - maxShortfall)
		for _, r := range []struct {
			reading string
			rate    float64
		}{{"Envoy's", envoyRate(b)}, {"literal", literalRate(b, 1000)}} {
			if r.rate > share*(1+1e-12) || r.rate < least {
				t.Fatalf("BucketFor(%v) = %+v: %s reading admits %v/s", share, b, r.reading, r.rate)
			}
		}
		// The burst: the tokens of the shortest interval that comes within
		// maxShortfall, fewer than 1/maxShortfall plus a second of share.
		if float64(b.MaxTokens) >= 1/maxShortfall+share {
			t.Fatalf("BucketFor(%v) = %+v: a burst of %d tokens", share, b, b.MaxTokens)
		}
	}
}

// TestBucketDistinctFrom: Envoy 1.40 keeps its token bucket across
// assignments equal in max_tokens, tokens_per_fill and fill_interval nanos;
// a bucket differing from the last one only in its interval seconds gets a
// token more of max_tokens (same rate both ways), others stay as they are.
func TestBucketDistinctFrom(t *testing.T) {
	a := TokenBucket{MaxTokens: 30, TokensPerFill: 30, FillInterval: time.Second}
	b := TokenBucket{MaxTokens: 30, TokensPerFill: 30, FillInterval: 2 * time.Second}
	if got := b.distinctFrom(a); got.MaxTokens != 31 || got.TokensPerFill != 30 || got.FillInterval != b.FillInterval {
		t.Errorf("after %+v, %+v became %+v: want max_tokens 31", a, b, got)
	}
	if got := a.distinctFrom(b.distinctFrom(a)); got != a {
		t.Errorf("back again: %+v, want %+v", got, a)
	}
	for _, prev := range []TokenBucket{{}, a, {MaxTokens: 29, TokensPerFill: 29, FillInterval: 2 * time.Second}} {
		if got := a.distinctFrom(prev); got != a {
			t.Errorf("after %+v, %+v became %+v: want it unchanged", prev, a, got)
		}
	}
}

// TestStartBucketBothReadings: a bucket the client starts full (Envoy's
// first of a bucket id, or after a blanket rule; a literal reader's every
// one) admits over the report interval, burst included, at most the share
// under both readings, and for shares of 20/s and more at least 90% of it.
func TestStartBucketBothReadings(t *testing.T) {
	r := ReportInterval.Seconds()
	for e := -0.69; e <= 6; e += 0.001 { // from 0.2/s: a token over the interval
		share := math.Pow(10, e)
		b := StartBucketFor(share, ReportInterval)
		if b.TokensPerFill > b.MaxTokens || b.FillInterval%time.Second != 0 {
			t.Fatalf("StartBucketFor(%v) = %+v: not the same under both readings", share, b)
		}
		envoy := float64(b.MaxTokens) + envoyRate(b)*r
		fills := math.Floor(r / b.FillInterval.Seconds()) // a literal reader's fills within the interval
		literal := float64(b.MaxTokens) + min(float64(b.TokensPerFill), float64(b.MaxTokens))*fills
		for _, x := range []struct {
			reading  string
			admitted float64
		}{{"Envoy's", envoy}, {"literal", literal}} {
			if x.admitted > share*r*(1+1e-12) || (x.reading == "Envoy's" && share >= 20 && x.admitted < 0.9*share*r) {
				t.Fatalf("StartBucketFor(%v) = %+v: %s reading admits %v over %v, the share %v", share, b, x.reading, x.admitted, ReportInterval, share*r)
			}
		}
	}
	for _, tt := range []struct {
		share float64
		want  TokenBucket
	}{
		{100, TokenBucket{MaxTokens: 83, TokensPerFill: 83, FillInterval: time.Second}}, // 83 + 5*83 = 498 of 500
		{39, TokenBucket{MaxTokens: 32, TokensPerFill: 32, FillInterval: time.Second}},  // 192 of 195
	} {
		if got := StartBucketFor(tt.share, ReportInterval); got != tt.want {
			t.Errorf("StartBucketFor(%v) = %+v, want %+v", tt.share, got, tt.want)
		}
	}
	// Below one token over the interval: BucketFor's.
	if got, want := StartBucketFor(0.1, ReportInterval), BucketFor(0.1); got != want {
		t.Errorf("StartBucketFor(0.1) = %+v, want BucketFor's %+v", got, want)
	}
}
