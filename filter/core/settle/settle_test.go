package settle

import (
	"errors"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/filter/core/config"
)

const ms = config.Millisecond

// TestQueueFormsBatches: charges of one key merge while they wait; a batch
// forms when BatchMax wait or the oldest has waited IntervalMs, within
// QueueMax charges in batches; a failed batch is due again after a
// backoff that doubles; an acknowledged one is gone.
func TestQueueFormsBatches(t *testing.T) {
	q := New(config.Settle{BatchMax: 2, IntervalMs: 100, QueueMax: 4, TimeoutMs: 1000}, NewTokens())
	for _, c := range []struct {
		key    string
		charge int64
		want   error
	}{{"a", 1, nil}, {"a", 2, nil}, {"b", 5, nil}, {strings.Repeat("k", MaxKey+1), 1, ErrKeyTooLong}} {
		if err := q.Add([]byte(c.key), c.charge, 0); !errors.Is(err, c.want) {
			t.Fatalf("Add(%.5s): %v, want %v", c.key, err, c.want)
		}
	}
	if got := q.Pending([]byte("a")); got != 3 || q.Waiting() != 2 {
		t.Fatalf("a: %d waiting (of %d), want 3 merged", got, q.Waiting())
	}
	// Two wait: a full batch at once.
	due := q.Due(nil, 1*ms)
	if len(due) != 1 || strings.Join(due[0].Keys, ",") != "a,b" || due[0].Amounts[0] != 3 || q.Waiting() != 0 {
		t.Fatalf("due %+v, %d waiting", due, q.Waiting())
	}
	b := due[0]
	q.Sent(b, 1*ms)
	if due, ok := q.NextDue(1000 * ms); !ok || due != 1*ms+1000*ms+1 {
		t.Fatalf("next due %d %v: the call's timeout", due, ok)
	}
	q.Add([]byte("c"), 1, 10*ms)
	if got := q.Due(nil, 50*ms); len(got) != 0 {
		t.Fatalf("a lone charge formed a batch before the interval: %v", got)
	}
	for _, step := range []struct {
		at   int64
		want int // batches due
	}{{110 * ms, 1}} {
		if got := q.Due(nil, step.at); len(got) != step.want {
			t.Fatalf("at %d: %d due, want %d", step.at, len(got), step.want)
		}
	}
	// A failure: due again after 100 ms, then 200 ms.
	q.Failed(b, 200*ms)
	for _, step := range []struct {
		at      int64
		resends bool
	}{{299 * ms, false}, {300 * ms, true}} {
		got := q.Due(nil, step.at)
		if resent := len(got) > 0 && got[0] == b; resent != step.resends {
			t.Fatalf("at %d: resent %v, want %v", step.at, resent, step.resends)
		}
	}
	q.Failed(b, 300*ms)
	if got := q.Due(nil, 499*ms); len(got) > 0 && got[0] == b {
		t.Fatal("the second backoff is not twice the first")
	}
	q.Remove(b)
	if charges, batches := q.InBatches(); charges != 1 || batches != 1 || q.Unsettled() != 1 {
		t.Fatalf("after the ack: %d charges in %d batches, %d unsettled", charges, batches, q.Unsettled())
	}
}

// TestQueueBounds: at most QueueMax charges wait (ErrFull), and no batch
// forms while the batches hold QueueMax charges.
func TestQueueBounds(t *testing.T) {
	q := New(config.Settle{BatchMax: 2, IntervalMs: 0, QueueMax: 2, TimeoutMs: 1000}, NewTokens())
	for i, k := range []string{"a", "b"} {
		if err := q.Add([]byte(k), 1, int64(i)); err != nil {
			t.Fatal(err)
		}
	}
	if got := q.Due(nil, 0); len(got) != 1 {
		t.Fatalf("%d batches", len(got))
	}
	q.Add([]byte("c"), 1, 0)
	q.Add([]byte("d"), 1, 0)
	if err := q.Add([]byte("e"), 1, 0); !errors.Is(err, ErrFull) {
		t.Fatalf("a third waiting charge: %v", err)
	}
	if got := q.Due(nil, 0); len(got) != 1 || q.Waiting() != 2 {
		t.Fatalf("a batch formed beyond queue_max in batches: %d due, %d waiting", len(got), q.Waiting())
	}
}

// TestQueueNetsRefunds: a key's charges and refunds net while they wait; a
// net refund is sent as one (a negative amount), a net of 0 not at all.
func TestQueueNetsRefunds(t *testing.T) {
	q := New(config.Settle{BatchMax: 64, IntervalMs: 0, QueueMax: 8, TimeoutMs: 1000}, NewTokens())
	for _, c := range []struct {
		key    string
		amount int64
	}{{"a", 10}, {"a", -25}, {"b", 7}, {"b", -7}, {"c", -3}, {"d", config.MaxCost}, {"d", config.MaxCost}, {"e", -config.MaxCost}, {"e", -config.MaxCost}} {
		if err := q.Add([]byte(c.key), c.amount, 0); err != nil {
			t.Fatal(err)
		}
	}
	due := q.Due(nil, 0)
	if len(due) != 1 {
		t.Fatalf("%d batches due", len(due))
	}
	got := map[string]int64{}
	for i, k := range due[0].Keys {
		got[k] = due[0].Amounts[i]
	}
	want := map[string]int64{"a": -15, "c": -3, "d": config.MaxCost, "e": -config.MaxCost}
	if len(got) != len(want) {
		t.Fatalf("batch %v, want %v (b nets to 0)", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("batch %v, want %v", got, want)
		}
	}
	if q.Unsettled() != 4 || q.Waiting() != 0 {
		t.Fatalf("%d unsettled, %d waiting", q.Unsettled(), q.Waiting())
	}
}
