package rlqs

import (
	"math"
	"time"
)

// TokenBucket is an assignment's token bucket: TokensPerFill every
// FillInterval, at most MaxTokens held. Zero TokensPerFill means deny all.
//
// token_bucket.proto can be read two ways, and BucketFor's buckets mean the
// same rate under both. Envoy's rate_limit_quota filter refills
// continuously at TokensPerFill/FillInterval (the interval truncated to
// whole seconds) up to MaxTokens. A client that reads the proto literally
// adds TokensPerFill once per FillInterval and never holds more than
// MaxTokens: unless TokensPerFill <= MaxTokens, the excess is lost and it
// admits less. So: whole-second intervals, TokensPerFill <= MaxTokens.
type TokenBucket struct {
	MaxTokens     uint32
	TokensPerFill uint32
	FillInterval  time.Duration
}

// Bucket sizing.
const (
	// maxShortfall is how far below the share a bucket's rate may be: the
	// rate is TokensPerFill whole tokens per whole seconds, at most the
	// share, and the smallest such bucket within maxShortfall of it is
	// taken (the smallest burst). Shares of 50/s and more get 1 s
	// intervals. The interval of a share near a whole number of tokens a
	// second may change from one report to the next (39/1s, then 77/2s):
	// Envoy applies a changed bucket keeping its fill ratio, so that costs
	// no burst, where a shortfall of 5% cost the three-Envoy test 2 to 5%
	// of its limit (shares of 38.99/s sent as 38/s).
	maxShortfall = 0.02
	// maxFillInterval bounds the fill interval of small shares: a share
	// below one token per maxFillInterval denies all.
	maxFillInterval = 10000 * time.Second
)

// BucketFor returns the token bucket that admits at most share requests per
// second, under either reading of token_bucket.proto (see TokenBucket):
// whole seconds of fill interval, TokensPerFill tokens per interval, and
// MaxTokens = TokensPerFill. Of the intervals whose whole tokens come
// within maxShortfall of the share it takes the one with the fewest tokens
// per fill (the smallest burst: fewer than 1/maxShortfall tokens plus one
// second of the share). One always does for a share of a token per
// maxFillInterval or more (the closest is kept should none). A share too
// small to give one token per maxFillInterval denies all.
func BucketFor(share float64) TokenBucket {
	maxSec := maxFillInterval.Seconds()
	if !(share > 0) || share*maxSec < 1 {
		return TokenBucket{}
	}
	if share >= math.MaxUint32 {
		return TokenBucket{MaxTokens: math.MaxUint32, TokensPerFill: math.MaxUint32, FillInterval: time.Second}
	}
	best, bestRate := TokenBucket{}, 0.0
	// try returns whether tokens per interval seconds (at most the share)
	// is close enough, keeping the closest seen.
	try := func(tokens, interval float64) bool {
		if tokens < 1 || interval > maxSec || tokens/interval > share {
			return false
		}
		if r := tokens / interval; r > bestRate {
			best = TokenBucket{MaxTokens: uint32(tokens), TokensPerFill: uint32(tokens), FillInterval: time.Duration(interval) * time.Second}
			bestRate = r
		}
		return tokens/interval >= share*(1-maxShortfall)
	}
	if share >= 1 {
		// Whole tokens per interval: the shortfall is under a token per
		// interval, under maxShortfall once share*interval >= 1/maxShortfall.
		for interval := 1.0; interval <= math.Ceil(1/maxShortfall); interval++ {
			if try(math.Floor(share*interval), interval) {
				break
			}
		}
		return best
	}
	// Below a token a second: for each count of tokens, the shortest
	// whole-second interval that keeps it at most the share. The shortfall
	// is under share/(tokens+share), under maxShortfall once tokens >=
	// 1/maxShortfall.
	for tokens := 1.0; tokens <= math.Ceil(1/maxShortfall); tokens++ {
		interval := math.Ceil(tokens / share)
		if tokens/interval > share { // rounding of tokens/share
			interval++
		}
		if interval > maxSec {
			break
		}
		if try(tokens, interval) {
			break
		}
	}
	return best
}

// StartBucketFor returns the bucket for a share that the client will start
// full: Envoy does for a bucket id whose assignment in force is not a token
// bucket (none yet, a blanket rule, an expired one), and a literal reader
// always does. Its burst and its rate together admit at most the share over
// interval, the time until the next report (whose assignment Envoy applies
// keeping the bucket's fill ratio, without a burst): of the whole-second
// fill intervals, the shortest whose largest such bucket comes within
// maxShortfall of the share over interval, else the closest. When even one
// token is more than the share over interval, it is BucketFor(share).
func StartBucketFor(share float64, interval time.Duration) TokenBucket {
	r := interval.Seconds()
	want := share * r
	if !(want >= 1) {
		return BucketFor(share)
	}
	best, bestAdmitted := TokenBucket{}, 0.0
	for i := 1.0; i <= maxFillInterval.Seconds(); i++ {
		// tokens t, a burst of t and t/i a second: t*(i+r)/i <= want
		t := math.Floor(want * i / (i + r))
		if t < 1 {
			continue
		}
		if t*(i+r)/i > want { // rounding of the quotient
			t--
		}
		t = min(t, math.MaxUint32)
		if a := t * (i + r) / i; t >= 1 && a > bestAdmitted {
			best, bestAdmitted = TokenBucket{MaxTokens: uint32(t), TokensPerFill: uint32(t), FillInterval: time.Duration(i) * time.Second}, a
			if a >= want*(1-maxShortfall) {
				break
			}
		}
	}
	if best.TokensPerFill == 0 {
		return BucketFor(share)
	}
	return best
}

// Rate returns the bucket's rate in requests per second.
func (b TokenBucket) Rate() float64 {
	if b.FillInterval <= 0 {
		return 0
	}
	return float64(b.TokensPerFill) / b.FillInterval.Seconds()
}

// distinctFrom returns b, made distinguishable by Envoy from prev, the
// bucket last sent for the same bucket id. Envoy 1.40 keeps its token
// bucket when a new assignment has the same max_tokens, tokens_per_fill and
// fill_interval nanos (it does not compare the seconds): a bucket that
// differs from prev only in its interval gets one token more of MaxTokens,
// which changes neither reading's rate.
func (b TokenBucket) distinctFrom(prev TokenBucket) TokenBucket {
	if b.TokensPerFill > 0 && b.MaxTokens == prev.MaxTokens && b.TokensPerFill == prev.TokensPerFill &&
		b.FillInterval != prev.FillInterval && b.MaxTokens < math.MaxUint32 {
		b.MaxTokens++
	}
	return b
}
