package rls

import (
	"context"
	"net"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/peer"

	"github.com/sluicehq/sluice/controlplane/store/memory"
)

// from returns a context whose peer is ip, as the decision servers give.
func from(ip string) context.Context {
	return peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP(ip), Port: 40000}})
}

// TestSettleTokenFlood is the hostile client of settlements: 1,000,000
// settle calls, each with a new token, while two other clients make
// ordinary calls and settle one in ten (10,000 each, within their share). With the budget the memory store's own bound (as
// the server sets it without Redis), the flood holds half of it and is
// then refused (RESOURCE_EXHAUSTED, counted); the store forgets no token
// (none of the other clients' retries could be charged twice); the heap
// stays within what the bound costs; every call of the others succeeds.
func TestSettleTokenFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("a million calls")
	}
	const tokens = 1_000_000
	st := memory.New(memory.Options{})
	svc, err := New(st, parse(t, settlePolicy), Options{Logger: quiet, SettleTokens: memory.DefaultMaxOnce})
	if err != nil {
		t.Fatal(err)
	}
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)

	var normal, normalOK, settled atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for c, ip := range []string{"127.0.0.1", "10.1.2.3"} {
		wg.Add(1)
		go func() { // another client: request-time checks (cost 0) of 1,000 keys, and a settlement every 10
			defer wg.Done()
			ctx := from(ip)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				var settle []string
				if i%10 == 9 && i < 100_000 { // 10,000 tokens: within a client's share (a sixth of the budget)
					settle = []string{"vm" + strconv.Itoa(c) + "-" + strconv.Itoa(i)}
				}
				_, err := svc.shouldRateLimit(ctx, settleReq("key=user-"+strconv.Itoa(i%1000)+":0"), nil)
				if err == nil && settle != nil {
					_, err = svc.shouldRateLimit(ctx, settleReq("key=user-"+strconv.Itoa(i%1000)+":1"), settle)
					settled.Add(1)
				}
				normal.Add(1)
				if err == nil { // answered (a settlement may well say OVER_LIMIT)
					normalOK.Add(1)
				}
				if i%1000 == 999 {
					runtime.Gosched()
				}
			}
		}()
	}
	var peak uint64
	var ms runtime.MemStats
	req := settleReq("key=flood:3")
	flood := from("127.0.0.2")
	refused := 0
	for i := range tokens {
		if _, err := svc.shouldRateLimit(flood, req, []string{"f-" + strconv.Itoa(i)}); err != nil {
			refused++
		}
		if i%100_000 == 99_999 {
			runtime.GC()
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapAlloc)
		}
	}
	close(stop)
	wg.Wait()

	stats := st.Stats()
	grew := int64(peak) - int64(before.HeapAlloc)
	t.Logf("%d settle tokens sent: %d refused, %d remembered (%d bytes by the store's count), %d dropped; heap grew %.1f MB at most; the other clients: %d of %d calls OK, %d settlements",
		tokens, refused, stats.Once, stats.OnceBytes, stats.OnceDropped, float64(grew)/(1<<20), normalOK.Load(), normal.Load(), settled.Load())
	if stats.OnceDropped != 0 || refused < tokens-memory.DefaultMaxOnce/2 {
		t.Errorf("%d tokens dropped, %d refused: want none dropped and the flood refused past half the budget", stats.OnceDropped, refused)
	}
	const budget = 40 << 20 // the bound's cost (about 15 MB), with room for what the other clients allocate meanwhile
	if grew > budget {
		t.Errorf("heap grew %d bytes under the flood, more than the %d budget", grew, budget)
	}
	if normal.Load() == 0 || normalOK.Load() != normal.Load() {
		t.Errorf("other clients' calls: %d of %d OK, want all", normalOK.Load(), normal.Load())
	}
}
