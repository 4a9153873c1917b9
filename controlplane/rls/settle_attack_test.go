package rls

import (
	"context"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sluicehq/sluice/controlplane/store/memory"
)

// TestSettleTokenFlood is the hostile client of settlements: 1,000,000
// settle calls, each with a new token, while another client makes ordinary
// calls. The memory store remembers at most memory.DefaultMaxOnce tokens
// (the oldest forgotten first, counted), the heap stays within what that
// bound costs, and every ordinary call is answered OK.
func TestSettleTokenFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("a million calls")
	}
	const tokens = 1_000_000
	st := memory.New(memory.Options{})
	svc, _ := newSettleService(t, st)
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)

	var normal, normalOK atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the other client: request-time checks (cost 0) of 1,000 keys
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			resp, err := svc.shouldRateLimit(context.Background(), settleReq("key=user-"+strconv.Itoa(i%1000)+":0"), nil)
			normal.Add(1)
			if err == nil && resp.OverallCode == ok {
				normalOK.Add(1)
			}
			if i%1000 == 999 {
				runtime.Gosched()
			}
		}
	}()
	var peak uint64
	var ms runtime.MemStats
	req := settleReq("key=flood:3")
	for i := range tokens {
		if _, err := svc.shouldRateLimit(context.Background(), req, []string{"f-" + strconv.Itoa(i)}); err != nil {
			t.Fatalf("settlement %d: %v", i, err)
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
	t.Logf("%d settle tokens: %d remembered (%d bytes by the store's count), %d dropped; heap grew %.1f MB at most; ordinary calls %d of %d OK",
		tokens, stats.Once, stats.OnceBytes, stats.OnceDropped, float64(grew)/(1<<20), normalOK.Load(), normal.Load())
	if stats.Once > memory.DefaultMaxOnce || stats.OnceDropped != tokens-memory.DefaultMaxOnce {
		t.Errorf("tokens remembered %d, dropped %d: want at most %d remembered and the rest dropped", stats.Once, stats.OnceDropped, memory.DefaultMaxOnce)
	}
	const budget = 40 << 20 // the bound's cost (about 15 MB), with room for what the other client allocates meanwhile
	if grew > budget {
		t.Errorf("heap grew %d bytes under the flood, more than the %d budget", grew, budget)
	}
	if normal.Load() == 0 || normalOK.Load() != normal.Load() {
		t.Errorf("ordinary calls: %d of %d OK, want all", normalOK.Load(), normal.Load())
	}
}
