package precheck

import (
	"strconv"
	"testing"
)

func TestTableOverLimitBlocksByCostUntilRetryAfter(t *testing.T) {
	const delay = 20 * ms
	tab := NewTable(8, delay)
	key := []byte("k")
	lim := Limit{Algorithm: Reserve, Limit: 10, Window: 1000 * ms, Burst: 5} // no bucket: only the block
	tab.Record(key, Outcome{Cost: 3, Limit: lim, HasLimit: true, OverLimit: true, RetryAfter: 500 * ms, SentAt: 100 * ms}, 110*ms)

	end := 100*ms + 500*ms - delay - unit
	for _, tt := range []struct {
		cost, now int64
		reject    bool
	}{
		{3, 110 * ms, true},
		{5, 300 * ms, true},
		{2, 300 * ms, false}, // a cheaper request may fit
		{3, end - 1, true},
		{3, end, false},
	} {
		v := tab.Check(key, tt.cost, tt.now)
		if v.Reject != tt.reject {
			t.Fatalf("cost %d at %d: reject %v, want %v", tt.cost, tt.now, v.Reject, tt.reject)
		}
		if v.Reject && (v.RetryAfter != end-tt.now || v.Limit == nil || *v.Limit != lim) {
			t.Fatalf("cost %d at %d: verdict %+v", tt.cost, tt.now, v)
		}
	}
	// A shorter block does not shorten a longer one; a later one extends it.
	tab.Record(key, Outcome{Cost: 3, Limit: lim, HasLimit: true, OverLimit: true, RetryAfter: 100 * ms, SentAt: 120 * ms}, 130*ms)
	if !tab.Check(key, 3, end-1).Reject {
		t.Fatal("a shorter block shortened the longer one")
	}
	tab.Record(key, Outcome{Cost: 3, Limit: lim, HasLimit: true, OverLimit: true, RetryAfter: 900 * ms, SentAt: 140 * ms}, 150*ms)
	if !tab.Check(key, 3, end+ms).Reject {
		t.Fatal("a later block did not extend the block")
	}
	// A block that ends before the answer arrives is not recorded.
	other := []byte("other")
	tab.Record(other, Outcome{Cost: 1, OverLimit: true, RetryAfter: 10 * ms, SentAt: 0}, 50*ms)
	if tab.Check(other, 1, 50*ms).Reject || tab.Len() != 1 {
		t.Fatal("an expired block was recorded")
	}
}

func TestTableBucketChargesOnlyAdmittedTimelyAnswers(t *testing.T) {
	const delay = ms // slack = ceil(2*1001us*10/1e6us) + 1 = 2 tokens
	tab := NewTable(8, delay)
	key := []byte("k")
	lim := Limit{Algorithm: TokenBucket, Limit: 10, Window: 1000 * ms, Burst: 10} // local burst 12
	admit := func(cost, sent, now int64) {
		tab.Record(key, Outcome{Cost: cost, Limit: lim, HasLimit: true, Admitted: true, SentAt: sent}, now)
	}
	admit(10, 0, 0)
	if v := tab.Check(key, 2, 0); v.Reject {
		t.Fatalf("2 of 12 left, yet rejected: %+v", v)
	}
	if v := tab.Check(key, 3, 0); !v.Reject || v.RetryAfter != 100*ms {
		t.Fatalf("3 with 2 left: %+v, want a rejection with retry-after 100ms", v)
	}
	// Checks are peeks: nothing was taken.
	if v := tab.Check(key, 2, 0); v.Reject {
		t.Fatal("Check consumed tokens")
	}
	// Denied requests and late answers charge nothing.
	tab.Record(key, Outcome{Cost: 2, Limit: lim, HasLimit: true, SentAt: 0}, 0)
	admit(2, 0, delay+1)
	if v := tab.Check(key, 2, delay+1); v.Reject {
		t.Fatal("a denied or late answer charged the bucket")
	}
	admit(2, 0, delay)
	if v := tab.Check(key, 1, delay); !v.Reject {
		t.Fatal("a timely admitted answer did not charge the bucket")
	}
	// A changed limit starts from a full bucket.
	lim.Burst = 20
	tab.Record(key, Outcome{Cost: 1, Limit: lim, HasLimit: true, SentAt: delay}, delay)
	if v := tab.Check(key, 20, delay); v.Reject {
		t.Fatalf("a new limit did not start full: %+v", v)
	}
	// No limit any more: no bucket.
	tab.Record(key, Outcome{Cost: 1, SentAt: delay}, delay)
	if v := tab.Check(key, 1000, delay); v.Reject {
		t.Fatal("the bucket survived the removal of its limit")
	}
}

func TestTableIsBoundedUnderHostileKeys(t *testing.T) {
	const max = 100
	tab := NewTable(max, 20*ms)
	lim := Limit{Algorithm: FixedWindow, Limit: 1, Window: 1000 * ms}
	hot := []byte("hot")
	for i := 0; i < 10000; i++ {
		key := []byte("attacker-" + strconv.Itoa(i))
		tab.Record(key, Outcome{Cost: 1, Limit: lim, HasLimit: true, OverLimit: true, RetryAfter: 10000 * ms}, 0)
		if i%10 == 0 { // a legitimately busy descriptor stays recent
			tab.Record(hot, Outcome{Cost: 1, Limit: lim, HasLimit: true, OverLimit: true, RetryAfter: 10000 * ms}, 0)
		}
		if tab.Len() > max || len(tab.entries) > max {
			t.Fatalf("table grew to %d entries", tab.Len())
		}
	}
	if !tab.Check(hot, 1, ms).Reject {
		t.Fatal("the recently used descriptor was evicted")
	}
	if tab.Check([]byte("attacker-0"), 1, ms).Reject {
		t.Fatal("the oldest descriptor was not evicted")
	}
	if !tab.Check([]byte("attacker-9999"), 1, ms).Reject {
		t.Fatal("the newest descriptor is missing")
	}
	// The LRU list and the index agree.
	n := 0
	for i := tab.head; i >= 0; i = tab.entries[i].next {
		if j := tab.lookup(tab.entries[i].key, tab.entries[i].hash); j != i {
			t.Fatalf("entry %d not indexed", i)
		}
		n++
	}
	if n != tab.Len() {
		t.Fatalf("list holds %d entries, index %d", n, tab.Len())
	}
}

func TestTableIgnoresLongKeys(t *testing.T) {
	tab := NewTable(8, 20*ms)
	long := make([]byte, MaxKeyLen+1)
	tab.Record(long, Outcome{Cost: 1, OverLimit: true, RetryAfter: 10000 * ms}, 0)
	if tab.Len() != 0 || tab.Check(long, 1, 0).Reject {
		t.Fatal("a key longer than MaxKeyLen was remembered")
	}
}

func TestTableCheckAllocatesNothing(t *testing.T) {
	tab := NewTable(8, 20*ms)
	key := []byte("descriptor")
	tab.Record(key, Outcome{Cost: 1, Limit: Limit{Algorithm: GCRA, Limit: 10, Window: 1000 * ms, Burst: 4}, HasLimit: true, Admitted: true}, 0)
	if n := testing.AllocsPerRun(100, func() { tab.Check(key, 1, ms) }); n != 0 {
		t.Fatalf("Check allocates %v times", n)
	}
}
