package degrade

import (
	"context"
	"time"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/store"
)

// seeder is a fallback that can start from the primary's answers
// (memory.Store.Seed).
type seeder interface {
	Seed(checks []store.Check, out []algorithms.Result)
}

// unloader is a fallback that reports what it admitted beyond what it was
// seeded with (memory.Store.Unload).
type unloader interface {
	Unload(drain bool, fn func([]store.Carry) error) error
}

// carrier is a primary that adds a fallback's admissions to its own state
// (redisstore.Store.Carry).
type carrier interface {
	Carry(ctx context.Context, carries []store.Carry) (int, error)
}

// onceUnloader is a fallback that reports the store.Once tokens it
// remembers (memory.Store.UnloadOnce).
type onceUnloader interface {
	UnloadOnce(fn func([]store.OnceMark) error) error
}

// onceMarker is a primary that remembers a fallback's store.Once tokens
// (redisstore.Store.MarkOnce).
type onceMarker interface {
	MarkOnce(ctx context.Context, marks []store.OnceMark) error
}

// carryTimeout bounds each carry pass on the way back to the primary.
const carryTimeout = 5 * time.Second

// recover switches decisions back to the primary after a good probe,
// carrying what the fallback admitted during the outage to the primary
// (and the settlement tokens it remembers, see onceUnloader) in two
// passes: the first while the fallback still decides (every key the
// outage touched; if the primary fails it, the Store stays degraded and
// the next probe tries again), the second right after the switch (what
// the fallback admitted during the first pass; it also empties the
// fallback, which the primary's answers then seed anew). Between the
// switch and the end of the second pass, a key's admissions during the
// first pass are not yet in the primary: at most that much more is
// admitted, for a few milliseconds.
func (s *Store) recover(ctx context.Context) {
	carried := 0
	carry := func(cs []store.Carry) error {
		cctx, cancel := context.WithTimeout(ctx, carryTimeout)
		defer cancel()
		n, err := s.carrier.Carry(cctx, cs)
		carried += n
		s.metrics.Carried.Add(float64(n))
		return err
	}
	mark := func(ms []store.OnceMark) error {
		cctx, cancel := context.WithTimeout(ctx, carryTimeout)
		defer cancel()
		return s.marker.MarkOnce(cctx, ms)
	}
	start := s.now()
	canCarry := s.unloader != nil && s.carrier != nil
	canMark := s.onceUnloader != nil && s.marker != nil
	if canCarry {
		if err := s.unloader.Unload(false, carry); err != nil {
			s.metrics.ProbeFailures.Inc()
			s.log.Warn("primary store answers again but refused the outage's counts: still deciding from the fallback store",
				"primary", s.primary.Name(), "error", err.Error())
			return
		}
	}
	if canMark {
		if err := s.onceUnloader.UnloadOnce(mark); err != nil {
			s.metrics.ProbeFailures.Inc()
			s.log.Warn("primary store answers again but refused the outage's settlement tokens: still deciding from the fallback store",
				"primary", s.primary.Name(), "error", err.Error())
			return
		}
	}
	s.trip.reset() // failures before the switch back do not count
	if !s.degraded.CompareAndSwap(true, false) {
		return
	}
	s.metrics.Degraded.Set(0)
	s.metrics.Transitions.WithLabelValues("primary").Inc()
	if canCarry {
		if err := s.unloader.Unload(true, carry); err != nil {
			s.log.Warn("carrying the last outage counts to the primary store failed: they are lost",
				"primary", s.primary.Name(), "error", err.Error())
		}
	}
	if canMark {
		if err := s.onceUnloader.UnloadOnce(mark); err != nil {
			s.log.Warn("giving the last settlement tokens of the outage to the primary store failed: a retry of those settlements may be charged again",
				"primary", s.primary.Name(), "error", err.Error())
		}
	}
	s.noSeed.Store(s.degraded.Load())
	s.log.Info("primary store answers again: deciding on it", "primary", s.primary.Name(),
		"carried_keys", carried, "took", s.now().Sub(start).String())
	if s.onChange != nil {
		s.onChange(false)
	}
}
