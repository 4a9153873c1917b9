package lease

import (
	"errors"
	"testing"

	"github.com/sluicehq/sluice/filter/core/config"
)

const ms = config.Millisecond

// TestNeed: a pool is renewed when it holds fewer units than its drain
// rate uses during two round trips (and a millisecond); before minSpan of
// draining, at its last unit; never before it drained by minDrain units.
func TestNeed(t *testing.T) {
	for _, tt := range []struct {
		name                   string
		markLeft, left         int64
		markAt, now, rtt, want int64
	}{
		{"taken once: too seldom used", 0, 0, 0, 100 * ms, 5 * ms, 0},
		{"taken once, 5 left", 5, 5, 0, 100 * ms, 5 * ms, 0},
		{"taken twice", 1, 0, 0, 1 * ms, 5 * ms, 1},
		{"too short to tell", 100, 90, 0, 40 * ms, 5 * ms, 1},
		{"100 in 100 ms, 11 ms lead", 200, 100, 0, 100 * ms, 5 * ms, 11},
		{"1 in 1 s", 10, 9, 0, 1000 * ms, 5 * ms, 1},
		{"slow round trips", 200, 100, 0, 100 * ms, 50 * ms, 101},
	} {
		e := &Entry{markLeft: tt.markLeft, markAt: tt.markAt}
		if got := e.need(tt.left, tt.now, tt.rtt); got != tt.want {
			t.Errorf("%s: need %d, want %d", tt.name, got, tt.want)
		}
	}
}

// fakePools records the renewals asked; other operations do nothing.
type fakePools struct {
	Pools
	renew    bool // what Renew answers
	renewals int
	answered int
}

func (p *fakePools) Renew(key []byte, now, deadline, low int64) (bool, error) {
	p.renewals++
	return p.renew, nil
}

func (p *fakePools) Answered(key []byte) error { p.answered++; return nil }

// fakeEnv records what the renewer asks of its worker.
type fakeEnv struct {
	sent, woken, changed int
	sendErr              error
}

func (e *fakeEnv) Send(*Entry, int64) (uint32, error) { e.sent++; return 9, e.sendErr }
func (e *fakeEnv) Wake([]byte)                        { e.woken++ }
func (e *fakeEnv) Changed(int64)                      { e.changed++ }
func (e *fakeEnv) Warn(string)                        {}

// TestRenewer: a take that leaves fewer units than the pool's drain needs
// starts a renewal (recorded in the pool, sent at once); one at a time per
// key; a renewal that cannot be sent ends, wakes the waiters, and the key
// backs off; a pool that ends is renewed Gap later on the tick, once.
func TestRenewer(t *testing.T) {
	p, env := &fakePools{renew: true}, &fakeEnv{}
	r := NewRenewer(true, 25*ms, p, env)
	key := []byte("k")
	r.NoteTake(key, true, 5, 1000*ms, 0) // a fresh pool: its end is due
	if env.changed != 1 || env.sent != 0 {
		t.Fatalf("changed %d, sent %d", env.changed, env.sent)
	}
	r.NoteTake(key, true, 0, 1000*ms, 1*ms) // the last unit: renew now
	if p.renewals != 1 || env.sent != 1 {
		t.Fatalf("renewals %d, sent %d", p.renewals, env.sent)
	}
	r.NoteTake(key, true, 0, 1000*ms, 2*ms) // one renewal at a time
	if p.renewals != 1 {
		t.Fatal("a second renewal while one is under way")
	}
	e := r.find(key)
	r.Answered(e, 6*ms)
	r.End(e, 6*ms, false) // brought nothing
	if p.answered != 1 || env.woken != 1 {
		t.Fatalf("answered %d, woken %d", p.answered, env.woken)
	}
	r.NoteTake(key, true, 0, 1000*ms, 7*ms) // within the backoff
	if p.renewals != 1 {
		t.Fatal("renewed within the backoff")
	}
	// The pool ends: the tick renews it Gap later, once.
	r.Tick(1000*ms + Gap - 1)
	if p.renewals != 1 {
		t.Fatal("renewed before Gap after the end")
	}
	r.Tick(1000*ms + Gap)
	r.Tick(1000*ms + 2*Gap)
	if p.renewals != 2 || env.sent != 2 {
		t.Fatalf("renewals %d, sent %d after the end", p.renewals, env.sent)
	}
	// A send that fails ends the renewal at once.
	env.sendErr = errors.New("no cluster")
	r.End(r.find(key), 1100*ms, true)
	r.RenewEnded(key, 1000*ms, 1100*ms)
	if env.sent != 3 || p.answered != 2 || r.pending != 0 {
		t.Fatalf("sent %d, answered %d, pending %d", env.sent, p.answered, r.pending)
	}
}
