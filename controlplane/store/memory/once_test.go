package memory

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/store"
)

// onceCharge charges cost on key with token and returns the result and
// whether the store called it a duplicate.
func onceCharge(t *testing.T, s *Store, key, token string, cost int64) (algorithms.Result, bool) {
	t.Helper()
	o := &store.Once{Token: token}
	out := make([]algorithms.Result, 1)
	lim := store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 100, Window: time.Hour}
	err := s.Decide(context.Background(), []store.Check{{Key: key, Limit: lim, Cost: cost, Mode: store.Charge, Once: o}}, out)
	if err != nil {
		t.Fatal(err)
	}
	return out[0], o.Duplicate
}

// TestOnce: a token charges once within the TTL, answers a probe of the
// key after it (over limit once a cost-1 request would be refused, with the
// time until one passes), and charges again once the TTL has passed.
func TestOnce(t *testing.T) {
	c := newClock()
	s := newStore(c, Options{OnceTTL: 15 * time.Minute})
	steps := []struct {
		token     string
		cost      int64
		dup       bool
		allowed   bool
		remaining int64
	}{
		{"a-1", 60, false, true, 40},
		{"a-1", 60, true, true, 40},  // a retry: nothing charged
		{"a-2", 40, false, false, 0}, // exactly the limit: a cost-1 request would be refused
		{"a-2", 40, true, false, 0},
		{"a-3", 30, false, false, 0}, // past the limit: charged anyway
	}
	for i, st := range steps {
		r, dup := onceCharge(t, s, "k", st.token, st.cost)
		if dup != st.dup || r.Allowed != st.allowed || r.Remaining != st.remaining {
			t.Fatalf("step %d (%s): dup %v %+v, want dup %v allowed %v remaining %d", i, st.token, dup, r, st.dup, st.allowed, st.remaining)
		}
		if !r.Allowed && r.RetryAfter <= 0 {
			t.Fatalf("step %d: refused without a retry-after: %+v", i, r)
		}
	}
	// The same token on another key is another pair.
	if _, dup := onceCharge(t, s, "other", "a-1", 1); dup {
		t.Fatal("token a-1 on another key called a duplicate")
	}
	c.Advance(15*time.Minute - time.Nanosecond)
	if _, dup := onceCharge(t, s, "k", "a-1", 1); !dup {
		t.Fatal("a-1 forgotten before its TTL")
	}
	c.Advance(time.Nanosecond)
	if _, dup := onceCharge(t, s, "k", "a-1", 1); dup {
		t.Fatal("a-1 remembered past its TTL")
	}
}

// TestOnceInvalid: a token on a check that is not a charge, or an empty
// or overlong one, is refused and changes nothing.
func TestOnceInvalid(t *testing.T) {
	s := newStore(newClock(), Options{})
	lim := store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 10, Window: time.Hour}
	out := make([]algorithms.Result, 1)
	for _, c := range []store.Check{
		{Key: "k", Limit: lim, Cost: 1, Once: &store.Once{Token: "t"}},
		{Key: "k", Limit: lim, Cost: 1, Mode: store.Charge, Once: &store.Once{}},
		{Key: "k", Limit: lim, Cost: 1, Mode: store.Charge, Once: &store.Once{Token: string(make([]byte, store.MaxOnceToken+1))}},
	} {
		if err := s.Decide(context.Background(), []store.Check{c}, out); err == nil {
			t.Fatalf("%+v accepted", c)
		}
	}
	if st := s.Stats(); st.Entries != 0 || st.Once != 0 {
		t.Fatalf("refused checks changed the store: %+v", st)
	}
}

// TestOnceBounded: distinct tokens past MaxOnce forget the oldest first,
// counted, and the table stays within its bound.
func TestOnceBounded(t *testing.T) {
	c := newClock()
	const max = 1000
	s := newStore(c, Options{MaxOnce: max})
	for i := 0; i < 5*max; i++ {
		if _, dup := onceCharge(t, s, "k", fmt.Sprint("t-", i), 0); dup {
			t.Fatalf("token %d called a duplicate", i)
		}
	}
	st := s.Stats()
	if st.Once != max || st.OnceDropped != 4*max {
		t.Fatalf("stats %+v, want %d held and %d dropped", st, max, 4*max)
	}
	if _, dup := onceCharge(t, s, "k", fmt.Sprint("t-", 5*max-1), 0); !dup {
		t.Fatal("the newest token was forgotten")
	}
	if _, dup := onceCharge(t, s, "k", "t-0", 0); dup {
		t.Fatal("the oldest token was kept past the bound")
	}
}

// TestUnloadOnce: the tokens remembered are reported once each, with the
// time they have left; a batch fn refuses is reported again.
func TestUnloadOnce(t *testing.T) {
	c := newClock()
	s := newStore(c, Options{OnceTTL: time.Minute})
	onceCharge(t, s, "k1", "a", 1)
	c.Advance(10 * time.Second)
	s.Seed([]store.Check{{Key: "k2", Limit: store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 100, Window: time.Hour}, Cost: 1, Mode: store.Charge, Once: &store.Once{Token: "b"}}}, make([]algorithms.Result, 1))
	refuse := errors.New("primary refused")
	if err := s.UnloadOnce(func([]store.OnceMark) error { return refuse }); err != refuse {
		t.Fatalf("UnloadOnce: %v, want fn's error", err)
	}
	var got []store.OnceMark
	if err := s.UnloadOnce(func(ms []store.OnceMark) error { got = append(got, ms...); return nil }); err != nil {
		t.Fatal(err)
	}
	want := []store.OnceMark{{Key: "k1", Token: "a", Left: 50 * time.Second}, {Key: "k2", Token: "b", Left: time.Minute}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("marks %v, want %v", got, want)
	}
	got = nil
	if err := s.UnloadOnce(func(ms []store.OnceMark) error { got = append(got, ms...); return nil }); err != nil || len(got) != 0 {
		t.Fatalf("second UnloadOnce: %v %v, want nothing", got, err)
	}
}
