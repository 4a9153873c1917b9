package precheck

import (
	"testing"

	"github.com/sluicehq/sluice/algorithms"
)

// TestTableRefundGivesBackTheLocalBucket: a refund puts back into the
// local bucket what the admitted reserve took, never above its capacity,
// so that a worker whose reserves were refunded does not reject what the
// global limiter would admit.
func TestTableRefundGivesBackTheLocalBucket(t *testing.T) {
	tab := NewTable(8, ms)
	key := []byte("k")
	lim := Limit{Algorithm: algorithms.KindTokenBucket, Limit: 10, Window: 1000 * ms, Burst: 10} // local burst 12
	tab.Record(key, Outcome{Cost: 10, Limit: lim, HasLimit: true, Admitted: true}, 0)
	if v := tab.Check(key, 5, 0); !v.Reject {
		t.Fatal("a reserve of 10 of 12 left room for 5")
	}
	tab.Refund(key, 8, 0)
	if v := tab.Check(key, 10, 0); v.Reject {
		t.Fatalf("after a refund of 8 (10 left), 10 was rejected: %+v", v)
	}
	tab.Refund(key, 1000, 0)
	tab.Record(key, Outcome{Cost: 12, Limit: lim, HasLimit: true, Admitted: true}, 0)
	if v := tab.Check(key, 1, 0); !v.Reject {
		t.Fatal("a refund filled the bucket past its capacity")
	}
	tab.Refund([]byte("unknown"), 5, 0) // nothing to refund: no panic, no entry
	if tab.Len() != 1 {
		t.Fatalf("%d entries", tab.Len())
	}
}

// TestTableUnblock: a block ends when the control plane says a refund freed
// its key; DropBlocks ends them all (another worker freed a key).
func TestTableUnblock(t *testing.T) {
	lim := Limit{Algorithm: algorithms.KindFixedWindow, Limit: 10, Window: 1000 * ms}
	own, other := []byte("own"), []byte("other")
	tab := NewTable(8, ms)
	deny := Outcome{Cost: 1, Limit: lim, HasLimit: true, OverLimit: true, RetryAfter: 500 * ms}
	tab.Record(own, deny, 0)
	b, _ := BlockOf(deny, 0)
	tab.Import(other, b, 0)
	if !tab.Check(own, 1, ms).Reject || !tab.Check(other, 1, ms).Reject {
		t.Fatal("not blocked")
	}
	tab.Unblock(own)
	if v := tab.Check(own, 1, ms); v.Reject || !tab.Check(other, 1, ms).Reject {
		t.Fatalf("unblocked own, yet rejected: %+v (or other freed too)", v)
	}
	tab.Record(own, deny, 2*ms) // the key's next denial blocks it again
	if !tab.Check(own, 1, 3*ms).Reject {
		t.Fatal("a denial after the unblock did not block")
	}
	if n := tab.DropBlocks(3 * ms); n != 2 || tab.Check(own, 1, 3*ms).Reject || tab.Check(other, 1, 3*ms).Reject {
		t.Fatalf("DropBlocks ended %d, want 2, and nothing rejected", n)
	}
}
