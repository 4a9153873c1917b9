package precheck

import (
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/sluicehq/sluice/algorithms"
)

// TestRecordAdmittedDefersTheCharge: an admission recorded without its
// answer's time takes in the limit at once and charges the bucket at the
// table's next call given a time, as Record would have charged it then:
// only within the call timeout of the request's sending.
func TestRecordAdmittedDefersTheCharge(t *testing.T) {
	const delay = ms // local burst 12, as in TestTableBucketChargesOnlyAdmittedTimelyAnswers
	lim := Limit{Algorithm: algorithms.KindTokenBucket, Limit: 10, Window: 1000 * ms, Burst: 10}
	admitted := func(cost, sent int64) Outcome {
		return Outcome{Cost: cost, Limit: lim, HasLimit: true, Admitted: true, SentAt: sent}
	}
	for _, tt := range []struct {
		name    string
		settle  func(tab *Table, key []byte) Verdict // the next call given a time, then a check of cost 3
		reject  bool                                 // charged: 10 of 12 taken, 3 does not fit
		retryNs int64
	}{
		{"Check in time", func(tab *Table, key []byte) Verdict { return tab.Check(key, 3, delay) }, true, 100 * ms},
		{"Check too late", func(tab *Table, key []byte) Verdict { return tab.Check(key, 3, delay+1) }, false, 0},
		{"Record of another key", func(tab *Table, key []byte) Verdict {
			tab.Record([]byte("other"), Outcome{Cost: 1, Limit: lim, HasLimit: true, SentAt: 0}, delay)
			return tab.Check(key, 3, delay)
		}, true, 100 * ms},
		{"Import of another key", func(tab *Table, key []byte) Verdict {
			tab.Import([]byte("other"), Block{PassAt: 1000 * ms, Cost: 1}, delay)
			return tab.Check(key, 3, delay)
		}, true, 100 * ms},
		{"Settle", func(tab *Table, key []byte) Verdict { tab.Settle(delay / 2); return tab.Check(key, 3, delay) }, true, 100*ms - delay/2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tab := NewTable(8, delay)
			key := []byte("k")
			if !tab.RecordAdmitted(key, admitted(10, 0)) || tab.Deferred() != 1 || tab.Len() != 1 {
				t.Fatalf("not deferred: %d charges, %d entries", tab.Deferred(), tab.Len())
			}
			v := tt.settle(tab, key)
			if v.Reject != tt.reject || (tt.reject && (v.RetryAfter != tt.retryNs || v.Policy == nil || v.Policy.Limit != lim)) {
				t.Fatalf("verdict %+v, want reject %v retry %d", v, tt.reject, tt.retryNs)
			}
			if tab.Deferred() != 0 {
				t.Fatalf("%d charges still wait", tab.Deferred())
			}
		})
	}
}

// TestRecordAdmittedChargesOnlyItsKey: a deferred charge whose entry was
// evicted before the time came is dropped, not made on the key that took
// the entry's place; and at most MaxDeferred charges wait.
func TestRecordAdmittedChargesOnlyItsKey(t *testing.T) {
	const delay = ms
	lim := Limit{Algorithm: algorithms.KindTokenBucket, Limit: 10, Window: 1000 * ms, Burst: 10}
	tab := NewTable(1, delay)
	tab.RecordAdmitted([]byte("gone"), Outcome{Cost: 10, Limit: lim, HasLimit: true, Admitted: true})
	// "new" takes the only entry, with a full bucket of 12, before the
	// time comes: its own charge of 1 is made, not the 10 of "gone".
	tab.RecordAdmitted([]byte("new"), Outcome{Cost: 1, Limit: lim, HasLimit: true, Admitted: true})
	if v := tab.Check([]byte("new"), 11, 0); v.Reject {
		t.Fatalf("another key's charge was made on the entry's new key: %+v", v)
	}

	tab = NewTable(2*MaxDeferred, delay)
	for i := range MaxDeferred {
		if !tab.RecordAdmitted([]byte("k"+strconv.Itoa(i)), Outcome{Cost: 1, Limit: lim, HasLimit: true, Admitted: true}) {
			t.Fatalf("charge %d refused", i)
		}
	}
	if tab.RecordAdmitted([]byte("one more"), Outcome{Cost: 1, Limit: lim, HasLimit: true, Admitted: true}) || tab.Len() != MaxDeferred {
		t.Fatalf("charge %d accepted (%d entries)", MaxDeferred+1, tab.Len())
	}
	tab.Settle(0)
	if tab.Deferred() != 0 || !tab.RecordAdmitted([]byte("one more"), Outcome{Cost: 1, Limit: lim, HasLimit: true, Admitted: true}) {
		t.Fatal("Settle did not make room")
	}
}

// TestTakeMatchesAllow holds take to algorithms.TokenBucket.Allow, over
// random valid buckets, states (including more used than the capacity),
// times (earlier than the state's too) and costs (invalid ones too).
func TestTakeMatchesAllow(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	taken, refused := 0, 0
	for i := 0; i < 200000; i++ {
		b, s, now, cost, valid := randomBucketCase(rng)
		if !valid {
			continue
		}
		want, got := s, s
		r, err := b.Allow(&want, now, cost)
		take(&b, &got, now, cost)
		if got != want {
			t.Fatalf("%+v %+v now %d cost %d: take left %+v, Allow %+v (%+v, %v)", b, s, now, cost, got, want, r, err)
		}
		if got != s {
			taken++
		} else {
			refused++
		}
	}
	if taken < 10000 || refused < 10000 {
		t.Fatalf("unbalanced cases: %d taken, %d refused", taken, refused)
	}
}
