package rlqs

import (
	"sync"
	"time"

	"github.com/sluicehq/sluice/controlplane/internal/fairshare"
)

// client is one connection's streams and what their buckets hold of the
// bucket budget: the unit of fairness. An Envoy holds one connection per
// control-plane replica, with a stream per rate_limit_quota filter
// configuration, so a client is an Envoy; a hostile client that opens many
// streams on one connection gets one share.
type client struct {
	addr    string
	streams map[*stream]struct{} // under Service.mu

	// Under bucketBudget.mu: the bytes its buckets hold (held + owed),
	// owed being those another client took by preemption that its streams
	// must still shed, and whether a shedder runs for it.
	held, owed int64
	shedding   bool
}

// bucketBudget bounds the bytes that the buckets of all streams hold
// (BucketCost each), shared among clients by fair shares (package
// fairshare). A client under its share that finds nothing free takes room
// from the client that holds the most over its share: that client owes the
// bytes, and shed drops as many of its buckets (see Service.shed). What
// the buckets hold is then at most total, plus, for the moment a shedder
// takes to run, the bytes owed.
type bucketBudget struct {
	shed func(*client) // drops buckets of a client that owes bytes

	mu        sync.Mutex
	total     int64
	free      int64
	holders   map[*client]struct{} // clients with held > 0
	preempted uint64               // preemptions, ever
}

func newBucketBudget(total int64, shed func(*client)) *bucketBudget {
	return &bucketBudget{shed: shed, total: total, free: total, holders: map[*client]struct{}{}}
}

// take takes cost bytes for a new bucket of c, from what is free or from
// the client most over its share, and reports whether it could.
func (b *bucketBudget) take(c *client, cost int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := int64(len(b.holders))
	if c.held == 0 {
		n++
	}
	share := fairshare.Share(b.total, n)
	switch {
	case fairshare.Fits(b.total, b.free, c.held, cost, int64(len(b.holders))):
		b.free -= cost
	case c.held+cost <= share && b.preempt(c, share, cost):
	default:
		return false
	}
	c.held += cost
	b.holders[c] = struct{}{}
	return true
}

// preempt moves cost bytes from the client that holds the most over share
// (other than c) to c's benefit, making it owe them, and reports whether
// there was one. Under b.mu.
func (b *bucketBudget) preempt(c *client, share, cost int64) bool {
	var most *client
	for h := range b.holders {
		if h != c && h.held > share && h.held >= cost && (most == nil || h.held > most.held) {
			most = h
		}
	}
	if most == nil {
		return false
	}
	most.held -= cost
	most.owed += cost
	if most.held == 0 {
		delete(b.holders, most)
	}
	b.preempted++
	if !most.shedding {
		most.shedding = true
		go b.shed(most)
	}
	return true
}

// release gives back bytes that c's buckets held: they pay what c owes
// first, and the rest is free.
func (b *bucketBudget) release(c *client, bytes int64) {
	if bytes == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	pay := min(c.owed, bytes)
	c.owed -= pay
	bytes -= pay
	c.held -= bytes
	b.free += bytes
	if c.held <= 0 {
		delete(b.holders, c)
	}
}

// owing returns what c still owes; at 0 its shedder stops (and the next
// preemption starts another).
func (b *bucketBudget) owing(c *client) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if c.owed <= 0 {
		c.shedding = false
	}
	return c.owed
}

// stopShedding ends c's shedder although c owes bytes: its buckets are
// being released by their streams' ends, which pay what it owes.
func (b *bucketBudget) stopShedding(c *client) {
	b.mu.Lock()
	c.shedding = false
	b.mu.Unlock()
}

// shed drops buckets of c, whose bytes another client took, until it owes
// none. It drops them without abandon_action (the stream may not read, and
// c is over its share of a full budget): their Envoy keeps its assignment
// until its time-to-live, and a report of such a bucket counts as a new
// bucket, refused while c stays over its share.
func (s *Service) shed(c *client) {
	for {
		owed := s.budget.owing(c)
		if owed <= 0 {
			return
		}
		st := s.largestStream(c)
		if st == nil {
			s.budget.stopShedding(c)
			return
		}
		var bytes int64
		var keys []string
		dropped := 0
		st.mu.Lock()
		for k, b := range st.buckets {
			if bytes >= owed {
				break
			}
			bytes += b.cost
			if b.demandKey != "" {
				keys = append(keys, b.demandKey)
			}
			delete(st.buckets, k)
			dropped++
		}
		st.mu.Unlock()
		s.m.shed.Add(float64(dropped))
		s.budget.release(c, bytes)
		s.release(st, keys, time.Time{})
		if bytes == 0 {
			s.budget.stopShedding(c)
			return
		}
	}
}

// largestStream returns the stream of c with the most buckets, or nil.
func (s *Service) largestStream(c *client) *stream {
	s.mu.Lock()
	streams := make([]*stream, 0, len(c.streams))
	for st := range c.streams {
		streams = append(streams, st)
	}
	s.mu.Unlock()
	var best *stream
	most := 0
	for _, st := range streams {
		st.mu.Lock()
		n := len(st.buckets)
		st.mu.Unlock()
		if n > most {
			best, most = st, n
		}
	}
	return best
}
