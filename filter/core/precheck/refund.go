package precheck

// Refunds: usage reserved at request time and given back at stream end.
// What the table learnt from the reserve (its local bucket's charge, a
// block) must not go on rejecting what the refund freed.

// Refund takes in, at now, a refund of n for the descriptor key: its local
// bucket, which took the reserve when the control plane admitted it, gets
// n back (never above its capacity), as the global limiter's does.
func (t *Table) Refund(key []byte, n, now int64) {
	if len(t.charges) > 0 {
		t.Settle(now)
	}
	if n <= 0 || len(key) > MaxKeyLen {
		return
	}
	i := t.lookup(key, hashKey(t.seed, key))
	if i < 0 || !t.entries[i].hasBucket {
		return
	}
	e := &t.entries[i]
	now /= unit
	b := &e.bucket
	if n > b.Burst {
		n = b.Burst // the product below stays in range
	}
	e.state.Used = max(0, usedAt(b, &e.state, now)-n*b.Period)
	e.state.Last = max(e.state.Last, now)
}

// Unblock ends the block of the descriptor key, if it has one: the control
// plane said that something remains (a refund freed it).
func (t *Table) Unblock(key []byte) {
	if len(key) > MaxKeyLen {
		return
	}
	if i := t.lookup(key, hashKey(t.seed, key)); i >= 0 {
		e := &t.entries[i]
		e.blockUntil, e.retryUntil = 0, 0
	}
}

// DropBlocks ends every block of the table and returns how many were live
// at now: another worker freed a key. The blocks still shared are imported
// again when a request meets them (Import).
func (t *Table) DropBlocks(now int64) int {
	n := 0
	for i := t.head; i >= 0; i = t.entries[i].next {
		if e := &t.entries[i]; e.blockUntil > now {
			n++
		}
		t.entries[i].blockUntil, t.entries[i].retryUntil = 0, 0
	}
	return n
}
