package precheck

import "github.com/sluicehq/sluice/algorithms"

// MaxDeferred is the most charges RecordAdmitted keeps waiting for the
// time; the next one is refused (the caller then reads the clock and calls
// Record).
const MaxDeferred = 64

// noBlock is no block, for record (never written).
var noBlock Block

// charge is an admitted request's charge of an entry's bucket, waiting for
// a time later than its answer's arrival.
type charge struct {
	entry  int32
	gen    uint32 // the entry's gen when the charge was made
	cost   int64
	sentAt int64
}

// RecordAdmitted is Record for a descriptor of a request the control plane
// admitted (o.Admitted, not o.OverLimit), when the caller has not read the
// time its answer arrived (in filter.wasm a host call): the limit, name and
// failure mode are taken in at once, and the local bucket's charge waits
// for the table's next call that is given the time (Check, Record, Import
// or Settle), which is later than the answer's arrival. Then it is made
// as Record would have made it then: only if that time is within the call
// timeout of o.SentAt.
//
// The precheck's bound holds for a charge made at any time c with g <= c
// <= g+D, g being the global decision (after o.SentAt, before the answer):
// a charge made later than the answer, but within D of o.SentAt, is one.
// A charge made later than that is dropped, which only admits more.
//
// It reports false, changing nothing, when MaxDeferred charges wait
// already.
func (t *Table) RecordAdmitted(key []byte, o Outcome) bool {
	if len(t.charges) >= MaxDeferred {
		return false
	}
	cost := o.Cost
	o.Admitted, o.OverLimit = false, false // no charge, no block now
	i := t.record(key, &o, &noBlock, false, true, o.SentAt)
	if i >= 0 && t.entries[i].hasBucket && cost > 0 {
		t.charges = append(t.charges, charge{entry: i, gen: t.entries[i].gen, cost: cost, sentAt: o.SentAt})
	}
	return true
}

// Deferred returns the number of charges waiting for the time.
func (t *Table) Deferred() int { return len(t.charges) }

// Settle makes, at now, the charges RecordAdmitted deferred: each one of
// an entry still of its key, with a bucket, and within the call timeout of
// its request's sending; the others are dropped.
func (t *Table) Settle(now int64) {
	for _, c := range t.charges {
		e := &t.entries[c.entry]
		if e.gen == c.gen && e.hasBucket && now-c.sentAt <= t.delay {
			take(&e.bucket, &e.state, now/unit, c.cost)
		}
	}
	t.charges = t.charges[:0]
}

// take charges bucket b in state s with a request of cost at now as
// b.Allow(s, now, cost) does (a test holds the two together): taken if it
// fits, else nothing changes. Like peek, it skips Allow's parameter checks
// and its Result, which filter.wasm zeroes and copies through memory; a
// cost Allow refuses as an error changes nothing.
func take(b *algorithms.TokenBucket, s *algorithms.TokenBucketState, now, cost int64) {
	if cost < 0 || cost > b.Burst {
		return
	}
	used := usedAt(b, s, now)
	if used += cost * b.Period; used > b.Burst*b.Period {
		return
	}
	s.Used = used
	if now > s.Last {
		s.Last = now
	}
}
