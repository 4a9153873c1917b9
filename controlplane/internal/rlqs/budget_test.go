package rlqs

import "testing"

// TestBucketBudgetAccounting: a client takes what is free within its fair
// share and leaves as much free as it holds; one under its share that
// finds too little free takes from the client most over its share, which
// owes the bytes (its shedder starts) until its released buckets pay them;
// what the clients hold plus what is free stays the total.
func TestBucketBudgetAccounting(t *testing.T) {
	shed := make(chan *client, 10)
	b := newBucketBudget(100, func(c *client) { shed <- c })
	a, c := &client{addr: "a"}, &client{addr: "c"}
	check := func(when string) {
		t.Helper()
		if sum := a.held + c.held + b.free; sum != b.total {
			t.Fatalf("%s: held %d+%d and free %d make %d, not the total %d", when, a.held, c.held, b.free, sum, b.total)
		}
	}
	takeAll := func(cl *client) int {
		n := 0
		for b.take(cl, 5) {
			n++
		}
		return n
	}
	if n := takeAll(a); n != 10 {
		t.Errorf("a client alone took %d buckets of 5, want half the total (10)", n)
	}
	check("a alone")
	// c's share with a holding some is a third (33): 5 of its 6 buckets
	// from what is free (it leaves as much free as it holds), the 6th from
	// a, the most over its share.
	if n := takeAll(c); n != 6 || c.held != 30 {
		t.Errorf("c took %d buckets (%d bytes), want 6 (30)", n, c.held)
	}
	check("c after a")
	if a.held != 45 || a.owed != 5 {
		t.Errorf("a holds %d and owes %d; want 45 and 5", a.held, a.owed)
	}
	if s := <-shed; s != a || len(shed) != 0 {
		t.Errorf("shedder started for %s (and %d more), want a's alone", s.addr, len(shed))
	}
	// a's buckets released pay what it owes first.
	b.release(a, 10)
	check("a released 10")
	if a.owed != 0 || a.held != 40 || b.free != 30 {
		t.Errorf("after a released 10 bytes: holds %d, owes %d, free %d; want 40, 0 and 30", a.held, a.owed, b.free)
	}
	if b.owing(a) != 0 || a.shedding {
		t.Errorf("a's shedder goes on with nothing owed")
	}
}
