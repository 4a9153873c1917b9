package lease

import (
	"context"
	"time"

	redisstore "github.com/sluicehq/sluice/controlplane/store/redis"
)

// Sweep gives back the unspent units of token_bucket and gcra leases that
// went unused for Idle or would expire within soon (the caller's interval
// between sweeps), counts what expired, and once a second forgets keys
// unused for a while. It looks only at the leases held, not at every key.
// It returns how many units went back.
func (s *Store) Sweep(ctx context.Context, soon time.Duration) (int64, error) {
	now := s.now()
	var rets []redisstore.Returned
	s.mu.Lock()
	for key, e := range s.held {
		if e.units > 0 && !now.Before(e.expiry) {
			s.expired.Add(e.units)
			e.units = 0
		}
		if e.units > 0 && redisstore.Returnable(e.limit.Algorithm) &&
			(now.Sub(e.lastUse) >= s.idle || e.expiry.Sub(now) <= soon) {
			rets = append(rets, redisstore.Returned{Key: key, Limit: e.limit, Units: e.units, End: e.end})
			e.units = 0
		}
		if e.units == 0 {
			delete(s.held, key)
		}
	}
	if now.Sub(s.lastForget) >= time.Second {
		s.lastForget = now
		for key, e := range s.keys {
			if e.units == 0 && !e.fetching && now.Sub(e.lastUse) > forget {
				delete(s.keys, key)
			}
		}
	}
	s.mu.Unlock()
	if len(rets) == 0 {
		return 0, nil
	}
	n, err := s.inner.Return(ctx, rets)
	var units int64
	if n == len(rets) {
		for _, r := range rets {
			units += r.Units
		}
	}
	s.returned.Add(units)
	return units, err
}

// Run sweeps every interval until ctx ends.
func (s *Store) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			sctx, cancel := context.WithTimeout(ctx, interval)
			_, _ = s.Sweep(sctx, 2*interval)
			cancel()
		}
	}
}

// Active reports whether a check of a leased limit has been seen.
func (s *Store) Active() bool { return s.local.Load()+s.perRequest.Load() > 0 }
