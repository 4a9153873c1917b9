package rls

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Defaults of the settlement token budget.
const (
	// DefaultSettleTokens is the tokens one replica may have the store
	// remember within the dedupe TTL: at most 133 MB of Redis (at 133
	// bytes a token); at the default TTL, 15 minutes, about 555 settled
	// charges a second before the budget is half used.
	DefaultSettleTokens = 1_000_000
	// DefaultSettleTTL is the dedupe TTL the budget counts tokens over,
	// when Options.SettleTTL is 0: the stores' default.
	DefaultSettleTTL = 15 * time.Minute
	// maxSettleClients bounds the clients the budget tells apart: the
	// clients past it share one entry (one share) until some leave.
	maxSettleClients = 4096
	// settleSlots is how many parts the TTL is counted in: a token is
	// counted from its part to the end of the part one TTL later, at most
	// a sixteenth of the TTL longer than the store keeps it.
	settleSlots = 16
)

// Why a settlement's tokens were refused (the label of
// sluice_settle_tokens_refused_total).
const (
	refusedFull  = "full"
	refusedShare = "share"
)

// tokenWindow counts tokens per part of the TTL over the last len(n)
// parts.
type tokenWindow struct {
	n    []int64 // per part, indexed by the part's number modulo len(n)
	head int64   // the part n was last moved to
	live int64   // sum of n
}

func newTokenWindow() tokenWindow { return tokenWindow{n: make([]int64, settleSlots+1)} }

// advance moves w to part, forgetting the parts that left the window.
func (w *tokenWindow) advance(part int64) {
	if part <= w.head {
		return
	}
	if part-w.head >= int64(len(w.n)) {
		clear(w.n)
		w.live = 0
	} else {
		for p := w.head + 1; p <= part; p++ {
			i := p % int64(len(w.n))
			w.live -= w.n[i]
			w.n[i] = 0
		}
	}
	w.head = part
}

// add counts k tokens in part, which w has been advanced to.
func (w *tokenWindow) add(part, k int64) {
	w.n[part%int64(len(w.n))] += k
	w.live += k
}

// give takes back up to k tokens counted in part, if part is still in
// the window.
func (w *tokenWindow) give(part, k int64) {
	if part > w.head || part <= w.head-int64(len(w.n)) {
		return
	}
	i := part % int64(len(w.n))
	k = min(k, w.n[i])
	w.n[i] -= k
	w.live -= k
}

// tokenBudget is a replica's budget of settlement tokens (see above). It
// is safe for concurrent use.
type tokenBudget struct {
	size int64 // tokens within a TTL
	part int64 // nanoseconds a part of the TTL lasts

	mu      sync.Mutex
	all     tokenWindow
	clients map[string]*tokenWindow
}

func newTokenBudget(size int64, ttl time.Duration) *tokenBudget {
	return &tokenBudget{size: size, part: max(int64(ttl)/settleSlots, 1), all: newTokenWindow(), clients: map[string]*tokenWindow{}}
}

// settleGrant is what a settlement took from the budget: k tokens of
// client's, counted in part.
type settleGrant struct {
	client string
	part   int64
	k      int64
}

// take counts k new tokens of client at now (Unix ns), or says why not:
// the reason label and the error to answer. All or nothing.
func (b *tokenBudget) take(client string, k, now int64) (settleGrant, string, error) {
	part := now / b.part
	b.mu.Lock()
	defer b.mu.Unlock()
	if part > b.all.head {
		b.all.advance(part)
		for id, w := range b.clients { // once a part: drop the clients that hold nothing
			if w.advance(part); w.live == 0 {
				delete(b.clients, id)
			}
		}
	}
	w := b.clients[client]
	if w == nil && len(b.clients) >= maxSettleClients {
		client = "" // past the table's bound: the newcomers share one entry
		w = b.clients[client]
	}
	holders := int64(len(b.clients))
	if w == nil {
		holders++
	} else {
		w.advance(part)
	}
	held := int64(0)
	if w != nil {
		held = w.live
	}
	share := b.size / (2 * holders)
	switch {
	case b.all.live+k > b.size:
		return settleGrant{}, refusedFull, status.Errorf(codes.ResourceExhausted,
			"sluice: settlement tokens: this replica remembers %d of the %d it may within the dedupe TTL (-settle-max-tokens); send the settlement again later with the same %s token",
			b.all.live, b.size, SettleHeader)
	case b.all.live+k > b.size/2 && held+k > share:
		return settleGrant{}, refusedShare, status.Errorf(codes.ResourceExhausted,
			"sluice: settlement tokens: this client holds %d of the %d remembered; past half of the %d a replica may remember, a client's share is %d (%d clients); send the settlement again later with the same %s token",
			held, b.all.live, b.size, share, holders, SettleHeader)
	}
	if w == nil {
		nw := newTokenWindow()
		nw.head = part
		w = &nw
		b.clients[client] = w
	}
	b.all.add(part, k)
	w.add(part, k)
	return settleGrant{client: client, part: part, k: k}, "", nil
}

// give returns k tokens of g that the store did not need (duplicates).
func (b *tokenBudget) give(g settleGrant, k int64) {
	k = min(k, g.k)
	if k <= 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.all.give(g.part, k)
	if w := b.clients[g.client]; w != nil {
		w.give(g.part, k)
	}
}

// live returns the tokens counted now.
func (b *tokenBudget) live() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.all.live
}

// settleClient names the client of a call for the budget: the peer's IP
// address, its /64 for IPv6; "" when ctx has no peer.
func settleClient(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return ""
	}
	a, ok := p.Addr.(*net.TCPAddr)
	if !ok {
		return p.Addr.Network() + ":" + p.Addr.String()
	}
	if ip4 := a.IP.To4(); ip4 != nil {
		return ip4.String()
	}
	return fmt.Sprintf("%s/64", a.IP.Mask(net.CIDRMask(64, 128)))
}
