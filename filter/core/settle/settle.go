// Package settle is the settlement queue of usage-based limits: the charges
// a worker owes the control plane once the responses said what the
// requests cost, merged per descriptor, formed into batches and kept until
// the control plane acknowledges them. It is bookkeeping only: the worker
// sends the batches (ShouldRateLimit calls with the x-sluice-settle header,
// the settlement contract v1) and tells the queue how each call ended.
//
// A charge waits in the queue, merged with the waiting charges of the same
// descriptor (the domain is the worker's, so the key is the descriptor),
// until a batch forms: BatchMax charges are waiting, or the oldest has
// waited IntervalMs (with IntervalMs 0, at once). A refund (a negative
// amount: reserved, not used) is a charge like the others and merges with
// them: a key's batch entry carries the net of its charges and refunds,
// sent as a charge or as a refund (is_negative_hits), and not at all when
// it nets to 0. A batch gets a token,
// <8 random hex digits of the worker>-<its sequence number>, and is frozen:
// it is sent as one call and, until the control plane acknowledges it,
// sent again with the same token and the same descriptors in the same
// order, backing off from 100ms to 10s, so that the control plane applies
// each (token, descriptor index) once. An acknowledged batch is dropped and
// never sent again.
//
// Bounds: at most QueueMax charges wait, and at most QueueMax charges are
// in batches (in flight or waiting to be sent again); a charge that finds
// the waiting queue full (and no waiting charge of its descriptor to merge
// into) is lost (ErrFull), as is one whose descriptor key is longer than
// MaxKey (ErrKeyTooLong). So one queue holds at most 2 × QueueMax charges,
// each a key of at most MaxKey bytes (one copy, shared by the queue and
// the batch) and under 100 bytes of bookkeeping: at most 2 × 4096 × (1024
// + 100) bytes, about 9.2 MB, with the defaults and the longest keys; with
// keys of tens of bytes, about 1 MB.
package settle

import (
	"errors"
	"math/rand/v2"
	"strconv"

	"github.com/sluicehq/sluice/filter/core/config"
	"github.com/sluicehq/sluice/filter/core/descriptors"
	"github.com/sluicehq/sluice/filter/core/rlsproto"
)

const (
	// MaxKey is the longest descriptor key (package descriptors' encoding)
	// a charge may have; a longer one is lost.
	MaxKey = 1024
	// backoffMin and backoffMax bound the wait before a failed batch is
	// sent again (doubling from the first to the second).
	backoffMin = 100 * config.Millisecond
	backoffMax = 10 * config.Second
)

// The reasons a charge is lost.
var (
	ErrKeyTooLong = errors.New("its descriptor key is longer than " + strconv.Itoa(MaxKey) + " bytes")
	ErrFull       = errors.New("the queue is full (settle.queue_max)")
)

// Tokens makes the batch tokens of one worker.
type Tokens struct {
	prefix string // 8 random hex digits
	seq    uint64
}

// NewTokens returns a token source with a random prefix.
func NewTokens() *Tokens {
	const hex = "0123456789abcdef"
	var b [8]byte
	r := rand.Uint32()
	for i := range b {
		b[i] = hex[r>>(28-4*i)&0xf]
	}
	return &Tokens{prefix: string(b[:])}
}

// next returns a new token.
func (t *Tokens) next() string {
	t.seq++
	return t.prefix + "-" + strconv.FormatUint(t.seq, 10)
}

// pending is a charge (or refund) waiting for a batch.
type pending struct {
	key    string // descriptor key (descriptors.AppendKey)
	amount int64  // > 0 a charge, < 0 a refund
}

// Batch is a frozen batch: sent, or waiting to be sent (again).
type Batch struct {
	Token    string
	Keys     []string
	Amounts  []int64 // per key: a charge (> 0) or a refund (< 0), never 0
	InFlight bool
	SentAt   int64
	retryAt  int64 // when it may be sent again
	Attempts int   // failed sends
}

// Queue is one worker's settlement queue. It is not safe for concurrent
// use.
type Queue struct {
	cfg       config.Settle
	tokens    *Tokens
	pending   []pending      // waiting, oldest first
	index     map[string]int // key -> index in pending
	since     int64          // when the oldest waiting charge arrived
	batches   []*Batch       // oldest first
	inBatches int            // charges in batches
	// Scratch of Frame.
	descs   []descriptors.Descriptor
	entries []descriptors.Entry
}

// New returns an empty queue of cfg whose batch tokens come from tokens.
func New(cfg config.Settle, tokens *Tokens) *Queue {
	return &Queue{cfg: cfg, tokens: tokens, index: map[string]int{}}
}

// Add queues a charge (amount > 0) or a refund (amount < 0, at most
// config.MaxCost either way) for the descriptor key at now, merged into a
// waiting one of the same key; an error says why it is lost.
func (q *Queue) Add(key []byte, amount int64, now int64) error {
	if len(key) > MaxKey {
		return ErrKeyTooLong
	}
	if i, ok := q.index[string(key)]; ok {
		pc := &q.pending[i]
		// Both are within ±MaxCost: no overflow.
		pc.amount = max(-config.MaxCost, min(pc.amount+amount, config.MaxCost))
		return nil
	}
	if len(q.pending) >= q.cfg.QueueMax {
		return ErrFull
	}
	if len(q.pending) == 0 {
		q.since = now
	}
	k := string(key)
	q.index[k] = len(q.pending)
	q.pending = append(q.pending, pending{key: k, amount: amount})
	return nil
}

// Due forms the batches that are due at now and appends to dst those that
// may be sent now: new, or failed and past their backoff.
func (q *Queue) Due(dst []*Batch, now int64) []*Batch {
	q.form(now)
	for _, b := range q.batches {
		if !b.InFlight && b.retryAt <= now {
			dst = append(dst, b)
		}
	}
	return dst
}

// form turns the waiting charges into batches when BatchMax of them wait
// or the oldest has waited IntervalMs, as long as the batches hold at most
// QueueMax charges. A key whose charges and refunds net to 0 is dropped.
func (q *Queue) form(now int64) {
	q.dropNil()
	taken := 0
	interval := int64(q.cfg.IntervalMs) * config.Millisecond
	for taken < len(q.pending) {
		rest := len(q.pending) - taken
		if rest < q.cfg.BatchMax && now-q.since < interval {
			break // neither full nor due
		}
		n := min(rest, q.cfg.BatchMax)
		if q.inBatches+n > q.cfg.QueueMax {
			break // wait for batches to be acknowledged
		}
		b := &Batch{Token: q.tokens.next(), Keys: make([]string, n), Amounts: make([]int64, n)}
		for j, pc := range q.pending[taken : taken+n] {
			b.Keys[j], b.Amounts[j] = pc.key, pc.amount
			delete(q.index, pc.key)
		}
		q.batches = append(q.batches, b)
		q.inBatches += n
		taken += n
	}
	if taken > 0 {
		left := copy(q.pending, q.pending[taken:])
		clear(q.pending[left:])
		q.pending = q.pending[:left]
		for i := range q.pending {
			q.index[q.pending[i].key] = i
		}
	}
}

// dropNil forgets the waiting keys whose charges and refunds net to 0.
func (q *Queue) dropNil() {
	kept := 0
	for _, pc := range q.pending {
		if pc.amount == 0 {
			delete(q.index, pc.key)
			continue
		}
		q.pending[kept] = pc
		q.index[pc.key] = kept
		kept++
	}
	clear(q.pending[kept:])
	q.pending = q.pending[:kept]
}

// Frame appends to dst the settle call of b for domain: a RateLimitRequest
// in gRPC's framing whose descriptors are b's keys, each with its charge
// or refund.
func (q *Queue) Frame(dst []byte, domain string, b *Batch) []byte {
	q.descs, q.entries = q.descs[:0], q.entries[:0]
	for _, k := range b.Keys {
		q.descs, q.entries, _ = descriptors.AppendParsed(q.descs, q.entries, k, 0) // keys are AppendKey's
	}
	return rlsproto.AppendSettleFrame(dst, domain, q.descs, b.Amounts)
}

// Sent records that b was sent at now.
func (q *Queue) Sent(b *Batch, now int64) { b.InFlight, b.SentAt = true, now }

// Failed schedules b to be sent again, with the same token, after a
// backoff.
func (q *Queue) Failed(b *Batch, now int64) {
	b.InFlight = false
	b.Attempts++
	backoff := backoffMin << min(b.Attempts-1, 7)
	b.retryAt = now + min(backoff, backoffMax)
}

// Remove forgets b: acknowledged, or refused for good.
func (q *Queue) Remove(b *Batch) {
	b.InFlight = false
	for i, x := range q.batches {
		if x == b {
			copy(q.batches[i:], q.batches[i+1:])
			q.batches[len(q.batches)-1] = nil
			q.batches = q.batches[:len(q.batches)-1]
			q.inBatches -= len(b.Keys)
			return
		}
	}
}

// NextDue returns when the queue next has something to do, if anything: a
// batch to form, one to send again, a call overdue (timeout: the settle
// calls' timeout and grace).
func (q *Queue) NextDue(timeout int64) (due int64, ok bool) {
	if n := len(q.pending); n > 0 && q.inBatches+min(n, q.cfg.BatchMax) <= q.cfg.QueueMax {
		due, ok = q.since+int64(q.cfg.IntervalMs)*config.Millisecond, true
	}
	for _, b := range q.batches {
		t := b.retryAt
		if b.InFlight {
			t = b.SentAt + timeout + 1
		}
		if !ok || t < due {
			due, ok = t, true
		}
	}
	return due, ok
}

// Unsettled returns the number of charges not acknowledged yet: waiting,
// or in batches.
func (q *Queue) Unsettled() int { return len(q.pending) + q.inBatches }

// Waiting returns the number of charges waiting for a batch.
func (q *Queue) Waiting() int { return len(q.pending) }

// InBatches returns the number of charges in batches, and the batches.
func (q *Queue) InBatches() (charges, batches int) { return q.inBatches, len(q.batches) }

// Pending returns the amount waiting for the descriptor key (a charge
// > 0, a refund < 0), 0 when none waits.
func (q *Queue) Pending(key []byte) int64 {
	if i, ok := q.index[string(key)]; ok {
		return q.pending[i].amount
	}
	return 0
}
