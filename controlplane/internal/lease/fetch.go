package lease

import (
	"context"
	"fmt"
	"time"

	redisstore "github.com/sluicehq/sluice/controlplane/store/redis"
)

// lateLease bounds a lease call after the check that asked for it stopped
// waiting (its timeout): Redis has most likely debited the units already,
// so the answer is still awaited and its units kept (fetch.late), rather
// than lost to everyone until their window ends.
const lateLease = time.Second

// fetch is one lease call under way. Its fields other than done are
// written before done is closed; abandoned is guarded by Store.mu.
type fetch struct {
	done      chan struct{}
	err       error
	grants    []redisstore.Lease
	abandoned bool // the check stopped waiting: the call keeps every unit
}

// startFetch sends the lease call of asks. Without a timeout it runs on
// ctx; with one, it runs detached from ctx's cancellation, bounded by
// lateLease (at least timeout), so that a late answer is still applied.
func (s *Store) startFetch(ctx context.Context, timeout time.Duration, asks []ask, reqs []redisstore.LeaseRequest, now time.Time) *fetch {
	f := &fetch{done: make(chan struct{}), grants: make([]redisstore.Lease, len(reqs))}
	lctx, cancel := ctx, context.CancelFunc(func() {})
	if timeout > 0 {
		lctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), max(timeout, lateLease))
	}
	go func() {
		defer cancel()
		err := s.inner.Lease(lctx, reqs, f.grants)
		s.mu.Lock()
		defer s.mu.Unlock()
		f.err = err
		if f.abandoned {
			s.late(asks, f, now)
		}
		close(f.done)
	}()
	return f
}

// await waits for f, at most timeout when it is positive. A check that
// stops waiting abandons f to its call, and gets an error wrapping
// context.DeadlineExceeded.
func (s *Store) await(f *fetch, timeout time.Duration) error {
	if timeout <= 0 {
		<-f.done
		return f.err
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-f.done:
		return f.err
	case <-t.C:
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-f.done: // answered meanwhile: the check uses it
		return f.err
	default:
	}
	f.abandoned = true
	return fmt.Errorf("lease: %w: no lease granted within %v", context.DeadlineExceeded, timeout)
}

// late applies the answer of a fetch its check abandoned: every unit
// granted goes to the key's lease, none to the check (it was answered
// elsewhere), valid from when the call was sent (now), so never past
// Redis's end. Called with s.mu held.
func (s *Store) late(asks []ask, f *fetch, now time.Time) {
	for j, a := range asks {
		e := a.e
		e.fetching = false
		if f.err != nil {
			continue
		}
		g := f.grants[j]
		e.remaining = g.Remaining
		e.resetAt = now.Add(g.ResetAfter)
		if g.Granted == 0 {
			continue
		}
		s.granted.Add(g.Granted)
		s.lateUnits.Add(g.Granted)
		if e.limit != a.limit || s.keys[a.key] != e {
			s.expired.Add(g.Granted) // the limit changed meanwhile
			continue
		}
		e.units += g.Granted
		e.expiry = now.Add(g.Valid)
		e.end = g.End
		s.held[a.key] = e
	}
}
