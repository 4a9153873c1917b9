package precheck

import (
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/algorithms"
)

func TestTableOverLimitBlocksByCostUntilRetryAfter(t *testing.T) {
	const delay = 20 * ms
	tab := NewTable(8, delay)
	key := []byte("k")
	lim := Limit{Algorithm: algorithms.KindReserve, Limit: 10, Window: 1000 * ms, Burst: 5} // no bucket: only the block
	tab.Record(key, Outcome{Cost: 3, Limit: lim, HasLimit: true, OverLimit: true, RetryAfter: 500 * ms, SentAt: 100 * ms}, 110*ms)

	// The block ends at the earliest time the control plane could have
	// allowed the request, less the call timeout; the client is told the
	// latest: the answer's arrival plus the retry-after.
	end := 100*ms + 500*ms - delay - unit
	retryAt := 110*ms + 500*ms
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
		if v.Reject && (v.RetryAfter != retryAt-tt.now || v.Policy == nil || v.Policy.Limit != lim) {
			t.Fatalf("cost %d at %d: verdict %+v", tt.cost, tt.now, v)
		}
	}
	// A shorter block does not shorten a longer one, nor the retry time; a
	// later one extends both.
	tab.Record(key, Outcome{Cost: 3, Limit: lim, HasLimit: true, OverLimit: true, RetryAfter: 100 * ms, SentAt: 120 * ms}, 130*ms)
	if v := tab.Check(key, 3, end-1); !v.Reject || v.RetryAfter != retryAt-(end-1) {
		t.Fatalf("a shorter block shortened the longer one: %+v", v)
	}
	tab.Record(key, Outcome{Cost: 3, Limit: lim, HasLimit: true, OverLimit: true, RetryAfter: 900 * ms, SentAt: 140 * ms}, 150*ms)
	if v := tab.Check(key, 3, end+ms); !v.Reject || v.RetryAfter != 150*ms+900*ms-(end+ms) {
		t.Fatalf("a later block did not extend the block and the retry time: %+v", v)
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
	lim := Limit{Algorithm: algorithms.KindTokenBucket, Limit: 10, Window: 1000 * ms, Burst: 10} // local burst 12
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
	lim := Limit{Algorithm: algorithms.KindFixedWindow, Limit: 1, Window: 1000 * ms}
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

// TestTableBound: a table filled and churned with keys and names of the
// longest length it keeps holds no more live memory than Bound says.
func TestTableBound(t *testing.T) {
	const max = 2000
	lim := Limit{Algorithm: algorithms.KindFixedWindow, Limit: 1, Window: 1000 * ms}
	name := strings.Repeat("n", MaxNameLen)
	heap := func() uint64 {
		var m runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	tab := NewTable(max, 20*ms)
	key := make([]byte, MaxKeyLen)
	for i := range 3 * max {
		copy(key, strconv.Itoa(i))
		tab.Record(key, Outcome{Cost: 1, Limit: lim, HasLimit: true, OverLimit: true, RetryAfter: 10000 * ms, Name: name}, 0)
	}
	used := heap() - before
	runtime.KeepAlive(tab)
	if tab.Len() != max || used > uint64(Bound(max)) {
		t.Fatalf("%d entries hold %d bytes, over Bound(%d) = %d", tab.Len(), used, max, Bound(max))
	}
	t.Logf("%d entries of %d-byte keys and names: %d bytes live, Bound %d", max, MaxKeyLen, used, Bound(max))
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
	tab.Record(key, Outcome{Cost: 1, Limit: Limit{Algorithm: algorithms.KindGCRA, Limit: 10, Window: 1000 * ms, Burst: 4}, HasLimit: true, Admitted: true}, 0)
	if n := testing.AllocsPerRun(100, func() { tab.Check(key, 1, ms) }); n != 0 {
		t.Fatalf("Check allocates %v times", n)
	}
}

// TestTableRetryAfterIsWhenTheGlobalLimiterAllows checks the retry-after a
// locally rejected client is told: a client that retries exactly then is
// allowed by the global limiter (nothing else arriving), whatever the
// algorithm and however the call's time splits between the way to the
// control plane and the way back.
func TestTableRetryAfterIsWhenTheGlobalLimiterAllows(t *testing.T) {
	for _, alg := range []algorithms.Kind{algorithms.KindFixedWindow, algorithms.KindSlidingWindow, algorithms.KindSlidingLog, algorithms.KindTokenBucket, algorithms.KindGCRA, algorithms.KindReserve} {
		t.Run(alg.String(), func(t *testing.T) {
			checked := 0
			for seed := 0; seed < 200; seed++ {
				rng := rand.New(rand.NewPCG(uint64(alg), uint64(seed)))
				delay := []int64{ms, 5 * ms, 20 * ms, 40 * ms}[rng.IntN(4)]
				o := randomOracle(rng, alg)
				tab := NewTable(4, delay)
				key := []byte("k")
				// Requests of cost 1, one after the other, until one is denied.
				var now int64
				denied := false
				for i := 0; i < 10000 && !denied; i++ {
					sent := now
					decided := sent + rng.Int64N(delay+1)
					r, err := o.allow(decided, 1)
					if err != nil {
						t.Fatal(err)
					}
					now = decided + rng.Int64N(sent+delay-decided+1)
					denied = !r.Allowed
					tab.Record(key, Outcome{Cost: 1, Limit: o.reported(), HasLimit: true, Admitted: r.Allowed,
						OverLimit: !r.Allowed, RetryAfter: r.RetryAfter, SentAt: sent}, now)
				}
				if !denied {
					continue
				}
				// A client rejected locally, at some time during the block,
				// retries after the retry-after it is told.
				at := now + rng.Int64N(delay+1)
				v := tab.Check(key, 1, at)
				if !v.Reject {
					continue // the block was over already
				}
				checked++
				retry := at + v.RetryAfter
				if r, err := o.peek(retry, 1); err != nil || !r.Allowed {
					t.Fatalf("seed %d (%+v, delay %d): rejected at %d with retry-after %d; at %d the global limiter says %+v %v",
						seed, o.reported(), delay, at, v.RetryAfter, retry, r, err)
				}
				if v := tab.Check(key, 1, retry); v.Reject {
					t.Fatalf("seed %d: the retry at the retry-after is rejected locally: %+v", seed, v)
				}
			}
			if checked < 50 {
				t.Fatalf("only %d of 200 runs had a local rejection to check", checked)
			}
		})
	}
}

func TestTableRemembersNameAndFailureMode(t *testing.T) {
	tab := NewTable(4, 20*ms)
	key := []byte("k")
	lim := Limit{Algorithm: algorithms.KindFixedWindow, Limit: 1, Window: 1000 * ms}
	deny := Outcome{Cost: 1, Limit: lim, HasLimit: true, OverLimit: true, RetryAfter: 500 * ms, Name: "per_key", FailureMode: FailureClosed}
	tab.Record(key, deny, 0)
	v := tab.Check(key, 1, ms)
	if !v.Reject || v.Policy == nil || v.Policy.Name != "per_key" || v.Policy.Limit != lim {
		t.Fatalf("verdict %+v", v)
	}
	first := v.Policy.Version
	if tab.FailureMode(key) != FailureClosed {
		t.Fatalf("failure mode %v, want closed", tab.FailureMode(key))
	}
	// The same policy again: same version. A renamed one: a new version.
	tab.Record(key, deny, ms)
	if v := tab.Check(key, 1, ms); v.Policy.Version != first {
		t.Fatalf("version changed from %d to %d for the same policy", first, v.Policy.Version)
	}
	deny.Name = "renamed"
	tab.Record(key, deny, ms)
	if v := tab.Check(key, 1, ms); v.Policy.Name != "renamed" || v.Policy.Version == first {
		t.Fatalf("after a rename: %+v", v.Policy)
	}
	// An overlong name is not remembered.
	deny.Name = strings.Repeat("x", MaxNameLen+1)
	tab.Record(key, deny, ms)
	if v := tab.Check(key, 1, ms); v.Policy.Name != "" {
		t.Fatalf("an overlong name was kept (%d bytes)", len(v.Policy.Name))
	}
	// Each answer replaces the failure mode, unknown included.
	tab.Record(key, Outcome{Cost: 1, Limit: lim, HasLimit: true, FailureMode: FailureOpen}, 2*ms)
	if tab.FailureMode(key) != FailureOpen {
		t.Fatalf("failure mode %v, want open", tab.FailureMode(key))
	}
	tab.Record(key, Outcome{Cost: 1, Limit: lim, HasLimit: true}, 3*ms)
	if tab.FailureMode(key) != FailureUnknown {
		t.Fatalf("failure mode %v, want unknown", tab.FailureMode(key))
	}
	// A descriptor with only a failure mode (no limit, no block) is
	// remembered; one with nothing is not.
	tab.Record([]byte("unlimited"), Outcome{Cost: 1, FailureMode: FailureClosed}, 0)
	tab.Record([]byte("nothing"), Outcome{Cost: 1}, 0)
	if tab.FailureMode([]byte("unlimited")) != FailureClosed || tab.Check([]byte("unlimited"), 1000, 0).Reject {
		t.Fatal("a descriptor with only a failure mode was not remembered as such")
	}
	if tab.Len() != 2 || tab.FailureMode([]byte("nothing")) != FailureUnknown || tab.FailureMode([]byte("absent")) != FailureUnknown {
		t.Fatalf("%d entries", tab.Len())
	}
}

// TestTableImportBlocksAsIfRecordedHere: a block another VM learnt rejects
// here exactly as the denial recorded here would, with this table's own
// call timeout: until PassAt less this timeout and 1us, for costs of at
// least the denied one, telling clients the recorder's retry time; never
// after. An import keeps the failure mode the table knew, and a block
// already over teaches nothing.
func TestTableImportBlocksAsIfRecordedHere(t *testing.T) {
	lim := Limit{Algorithm: algorithms.KindReserve, Limit: 10, Window: 1000 * ms, Burst: 5}
	o := Outcome{Cost: 3, Limit: lim, HasLimit: true, OverLimit: true, RetryAfter: 500 * ms, SentAt: 100 * ms, Name: "n"}
	b, ok := BlockOf(o, 110*ms)
	if !ok || b.PassAt != 600*ms || b.RetryAt != 610*ms || b.Cost != 3 || b.Limit != lim || !b.HasLimit || b.Name != "n" {
		t.Fatalf("BlockOf: %+v %v", b, ok)
	}
	if _, ok := BlockOf(Outcome{Cost: 1, OverLimit: true}, 0); ok {
		t.Fatal("a denial without a retry-after makes a block")
	}
	if _, ok := BlockOf(Outcome{Cost: 1, RetryAfter: ms}, 0); ok {
		t.Fatal("an admission makes a block")
	}
	key := []byte("k")
	for _, delay := range []int64{20 * ms, 200 * ms} {
		recorded, imported := NewTable(8, delay), NewTable(8, delay)
		recorded.Record(key, o, 110*ms)
		imported.Record(key, Outcome{Cost: 1, FailureMode: FailureClosed}, 105*ms)
		imported.Import(key, b, 120*ms)
		end := 600*ms - delay - unit
		for _, tt := range []struct{ cost, now int64 }{{3, 120 * ms}, {2, 200 * ms}, {9, end - 1}, {3, end}, {3, end + ms}} {
			want, got := recorded.Check(key, tt.cost, tt.now), imported.Check(key, tt.cost, tt.now)
			if got.Reject != (tt.now < end && tt.cost >= 3) || got.Reject != want.Reject || got.RetryAfter != want.RetryAfter {
				t.Fatalf("delay %d, cost %d at %d: imported %+v, recorded %+v", delay, tt.cost, tt.now, got, want)
			}
			if got.Reject && (got.Policy == nil || got.Policy.Limit != lim || got.Policy.Name != "n") {
				t.Fatalf("delay %d: policy %+v", delay, got.Policy)
			}
		}
		if imported.FailureMode(key) != FailureClosed {
			t.Fatalf("delay %d: the import changed the failure mode", delay)
		}
		// Over by this table's timeout: nothing to learn.
		late := NewTable(8, delay)
		late.Import(key, b, end)
		if late.Len() != 0 || late.Check(key, 3, end).Reject {
			t.Fatalf("delay %d: a block over was imported", delay)
		}
	}
}

// TestTableBucketOfEachKeysLimit: keys of different limits recorded in
// turn each get the local bucket of their own limit (the table remembers
// the last limit's bucket).
func TestTableBucketOfEachKeysLimit(t *testing.T) {
	const delay = 20 * ms
	tab := NewTable(10, delay)
	limits := []Limit{
		{Algorithm: algorithms.KindFixedWindow, Limit: 1000, Window: 3600e3 * ms},
		{Algorithm: algorithms.KindTokenBucket, Limit: 10, Window: 1000 * ms, Burst: 10},
		{Algorithm: algorithms.KindFixedWindow, Limit: 1000, Window: 3600e3 * ms},
		{Algorithm: algorithms.KindReserve, Limit: 10, Window: 1000 * ms, Burst: 10}, // no local bucket
		{Algorithm: algorithms.KindSlidingWindow, Limit: 50, Window: 60e3 * ms},
		{Algorithm: algorithms.KindTokenBucket, Limit: 10, Window: 1000 * ms, Burst: 10},
	}
	for i, l := range limits {
		key := []byte("k" + strconv.Itoa(i))
		tab.Record(key, Outcome{Cost: 1, Limit: l, HasLimit: true}, 0)
		e := &tab.entries[tab.lookup(key, hashKey(tab.seed, key))]
		want, ok := localBucket(l, delay)
		if e.bucket != want || e.hasBucket != ok {
			t.Errorf("key %d (%+v): bucket %+v %v, want %+v %v", i, l, e.bucket, e.hasBucket, want, ok)
		}
	}
}
