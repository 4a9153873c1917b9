// The limits as the store sees them.

package rls

import (
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/sluicehq/sluice/controlplane/policy"
	"github.com/sluicehq/sluice/controlplane/store"
)

// storeEntries appends a descriptor's entries, for store.Key, to buf.
func storeEntries(buf []store.Entry, d *ratelimitv3.RateLimitDescriptor) []store.Entry {
	for _, e := range d.GetEntries() {
		buf = append(buf, store.Entry{Key: e.GetKey(), Value: e.GetValue()})
	}
	return buf
}

// storeAlgorithms maps policy algorithms to the store's.
var storeAlgorithms = map[policy.Algorithm]store.Algorithm{
	policy.FixedWindow:   store.FixedWindow,
	policy.SlidingWindow: store.SlidingWindow,
	policy.SlidingLog:    store.SlidingLog,
	policy.TokenBucket:   store.TokenBucket,
	policy.GCRA:          store.GCRA,
	policy.Reserve:       store.Reserve,
}

// storeLimit returns what the store needs to know of l.
func storeLimit(l *policy.Limit) store.Limit {
	return store.Limit{Algorithm: storeAlgorithms[l.Algorithm], Requests: l.Requests, Window: l.Window, Burst: l.Burst, MaxWait: l.MaxWait,
		Lease: l.Lease, Calendar: l.Calendar}
}

// capacity returns the most a limit admits at one instant: the largest
// cost it can ever allow.
func capacity(l store.Limit) int64 {
	if (l.Algorithm == store.TokenBucket || l.Algorithm == store.GCRA || l.Algorithm == store.Reserve) && l.Burst > 0 {
		return l.Burst
	}
	return l.Requests
}
