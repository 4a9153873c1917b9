package algorithms

// Kind names one of the algorithms: what a policy's algorithm field says,
// what a store decides a limit by, what the control plane tells the filter.
// The zero Kind is no algorithm (an unlimited limit has none).
type Kind uint8

// The algorithms, in the order policies list them.
const (
	KindUnknown       Kind = iota
	KindFixedWindow        // FixedWindow: clock-aligned windows, as envoyproxy/ratelimit
	KindSlidingWindow      // SlidingWindow: the two-window weighted counter
	KindSlidingLog         // SlidingLog: an exact log of what was admitted
	KindTokenBucket        // TokenBucket: Burst tokens refilled at Rate per Period
	KindGCRA               // GCRA: redis-cell's CL.THROTTLE; Burst is max_burst+1
	KindReserve            // Reserve: waits up to MaxWait instead of refusing
)

// kindNames are the kinds' names as policies write them.
var kindNames = [...]string{
	KindUnknown:       "unknown",
	KindFixedWindow:   "fixed_window",
	KindSlidingWindow: "sliding_window",
	KindSlidingLog:    "sliding_log",
	KindTokenBucket:   "token_bucket",
	KindGCRA:          "gcra",
	KindReserve:       "reserve",
}

// Kinds returns every algorithm, in the order policies list them.
func Kinds() []Kind {
	return []Kind{KindFixedWindow, KindSlidingWindow, KindSlidingLog, KindTokenBucket, KindGCRA, KindReserve}
}

// String returns k's name as policies write it, e.g. "token_bucket", or
// "unknown".
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return kindNames[KindUnknown]
}

// ParseKind returns the algorithm a policy names, and whether there is one.
func ParseKind(name string) (Kind, bool) {
	for k := KindFixedWindow; int(k) < len(kindNames); k++ {
		if kindNames[k] == name {
			return k, true
		}
	}
	return KindUnknown, false
}

// HasBurst reports whether k takes a burst: the capacity of TokenBucket and
// Reserve, MaxBurst+1 of GCRA.
func (k Kind) HasBurst() bool { return k == KindTokenBucket || k == KindGCRA || k == KindReserve }

// HasWindows reports whether k counts in windows, which may be calendar
// periods (Periods): FixedWindow, SlidingWindow and SlidingLog. The others
// refill at every instant.
func (k Kind) HasWindows() bool {
	return k == KindFixedWindow || k == KindSlidingWindow || k == KindSlidingLog
}
