package xdsconfig

import (
	"math"
	"time"
)

// Defaults of Backoff, as envoyproxy/ratelimit's XDS_CLIENT_BACKOFF_*.
const (
	DefaultBackoffInitial      = 10 * time.Second
	DefaultBackoffMax          = 60 * time.Second
	DefaultBackoffRandomFactor = 0.5
)

// Backoff says how long to wait before reconnecting after a failed or
// broken stream: Initial, doubled after each failure in a row up to Max,
// each wait spread by RandomFactor (0.5: anywhere from half to one and a
// half times) so that replicas do not reconnect in step.
type Backoff struct {
	Initial, Max time.Duration
	RandomFactor float64
}

// withDefaults fills zero fields.
func (b Backoff) withDefaults() Backoff {
	if b.Initial <= 0 {
		b.Initial = DefaultBackoffInitial
	}
	if b.Max <= 0 {
		b.Max = DefaultBackoffMax
	}
	if b.Max < b.Initial {
		b.Max = b.Initial
	}
	if !(b.RandomFactor >= 0) { // NaN too
		b.RandomFactor = 0
	}
	if b.RandomFactor > 1 {
		b.RandomFactor = 1
	}
	return b
}

// Delay returns the wait before attempt (0 for the first retry after a
// failure), given rnd drawn uniformly from [0, 1). It never returns more
// than Max times (1 + RandomFactor) nor less than Initial times (1 -
// RandomFactor).
func (b Backoff) Delay(attempt int, rnd float64) time.Duration {
	b = b.withDefaults()
	d := b.Initial
	for i := 0; i < attempt && d < b.Max; i++ {
		d = min(d, b.Max/2) * 2 // never past Max: no overflow
	}
	d = min(d, b.Max)
	spread := 1 + b.RandomFactor*(2*rnd-1)
	return time.Duration(min(float64(d)*spread, math.MaxInt64/2))
}
