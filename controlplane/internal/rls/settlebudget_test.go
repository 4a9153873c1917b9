package rls

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// TestTokenBudget walks a budget of 100 tokens over a TTL of 16 s (parts of
// 1 s) on synthetic time: clients within their share are served past half
// the budget, one beyond it is refused until its tokens expire, the whole
// budget is never passed, and duplicates give back what they took.
func TestTokenBudget(t *testing.T) {
	const s = int64(time.Second)
	b := newTokenBudget(100, 16*time.Second)
	type step struct {
		at     int64 // seconds
		client string
		k      int64
		give   int64  // tokens of this grant given back (duplicates)
		refuse string // "" to be served, else the reason
		live   int64  // tokens counted after the step
	}
	for i, st := range []step{
		{at: 0, client: "flood", k: 40, live: 40},
		{at: 1, client: "flood", k: 10, live: 50},                      // half the budget: alone, its share is 50
		{at: 1, client: "flood", k: 1, refuse: refusedShare, live: 50}, // past half, beyond its share
		{at: 2, client: "a", k: 25, live: 75},                          // two clients: shares of 25
		{at: 2, client: "a", k: 1, refuse: refusedShare, live: 75},
		{at: 3, client: "b", k: 16, live: 91}, // three: shares of 16
		{at: 3, client: "c", k: 12, refuse: refusedFull, live: 91},
		{at: 3, client: "c", k: 9, give: 4, live: 96}, // 4 were duplicates
		{at: 4, client: "c", k: 5, refuse: refusedFull, live: 96},
		{at: 4, client: "c", k: 4, live: 100},
		{at: 4, client: "d", k: 1, refuse: refusedFull, live: 100},
		// The flood's first 40 leave at 17 s (part 0 plus one TTL), its
		// next 10 at 18 s; nothing else before 19 s.
		{at: 17, client: "d", k: 1, live: 61},                            // five clients: shares of 10
		{at: 18, client: "flood", k: 1, live: 52},                        // it holds nothing now: a newcomer
		{at: 18, client: "flood", k: 10, refuse: refusedShare, live: 52}, // 11 > 10
		{at: 60, client: "e", k: 51, refuse: refusedShare, live: 0},      // all expired: alone, half at most
		{at: 60, client: "e", k: 50, live: 50},
	} {
		g, reason, err := b.take(st.client, st.k, st.at*s)
		if reason != st.refuse || (err != nil) != (st.refuse != "") {
			t.Fatalf("step %d (%+v): reason %q, error %v", i, st, reason, err)
		}
		if err != nil && status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("step %d: %v, want RESOURCE_EXHAUSTED", i, err)
		}
		if st.give > 0 {
			b.give(g, st.give)
		}
		if got := b.live(); got != st.live {
			t.Fatalf("step %d (%+v): %d tokens counted, want %d", i, st, got, st.live)
		}
	}
	if len(b.clients) != 1 {
		t.Errorf("%d clients remembered, want only the one holding tokens", len(b.clients))
	}
}

// TestTokenBudgetClients: past maxSettleClients clients, newcomers share
// one entry (and one share) instead of growing the table.
func TestTokenBudgetClients(t *testing.T) {
	b := newTokenBudget(1<<40, time.Minute)
	for i := range maxSettleClients + 100 {
		if _, _, err := b.take(net.IPv4(10, byte(i>>16), byte(i>>8), byte(i)).String(), 1, 0); err != nil {
			t.Fatal(err)
		}
	}
	if len(b.clients) != maxSettleClients+1 || b.clients[""].live != 100 {
		t.Errorf("%d clients, the shared entry holds %v", len(b.clients), b.clients[""])
	}
}

// TestSettleClient: a client is its IP address, an IPv6 /64.
func TestSettleClient(t *testing.T) {
	for _, tc := range []struct {
		addr net.Addr
		want string
	}{
		{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 2), Port: 5000}, "127.0.0.2"},
		{&net.TCPAddr{IP: net.ParseIP("::ffff:10.0.0.1"), Port: 1}, "10.0.0.1"},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:3:4:5:6"), Port: 1}, "2001:db8:1:2::/64"},
		{&net.UnixAddr{Name: "/run/s.sock", Net: "unix"}, "unix:/run/s.sock"},
	} {
		ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: tc.addr})
		if got := settleClient(ctx); got != tc.want {
			t.Errorf("%v: %q, want %q", tc.addr, got, tc.want)
		}
	}
	if got := settleClient(context.Background()); got != "" {
		t.Errorf("no peer: %q", got)
	}
}
