package memory

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/store"
)

// TestByteAccounting checks that Stats.Bytes covers what the entries take on
// the Go heap (map slots included), so that MaxBytes bounds memory rather
// than a guess: for each algorithm and short, typical and long keys, the
// heap grown by filling a store is at most its accounted bytes, and not far
// below them.
func TestByteAccounting(t *testing.T) {
	if testing.Short() {
		t.Skip("fills stores of 150,000 entries")
	}
	const n = 150_000 // a fill level where the maps' tables are dense
	algs := []store.Limit{
		{Algorithm: algorithms.KindFixedWindow, Requests: 10, Window: 10 * time.Second},
		{Algorithm: algorithms.KindSlidingWindow, Requests: 10, Window: 10 * time.Second},
		{Algorithm: algorithms.KindSlidingLog, Requests: 10, Window: 10 * time.Second},
		{Algorithm: algorithms.KindTokenBucket, Requests: 10, Window: 10 * time.Second},
		{Algorithm: algorithms.KindGCRA, Requests: 10, Window: 10 * time.Second},
	}
	for _, l := range algs {
		for _, keyLen := range []int{20, 60, 130} {
			t.Run(fmt.Sprintf("%s/key%d", l.Algorithm, keyLen), func(t *testing.T) {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				s := New(Options{MaxEntries: 1 << 30, MaxBytes: 1 << 40})
				pad := strings.Repeat("k", keyLen-12)
				checks := []store.Check{{Limit: l, Cost: 1}}
				out := make([]algorithms.Result, 1)
				for i := range n {
					checks[0].Key = fmt.Sprintf("%s%012d", pad, i)
					if err := s.Decide(context.Background(), checks, out); err != nil {
						t.Fatal(err)
					}
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				heap := int64(after.HeapAlloc) - int64(before.HeapAlloc)
				acc := s.Stats().Bytes
				t.Logf("%d entries: accounted %d bytes/entry, heap %d bytes/entry", n, acc/n, heap/n)
				if heap > acc || heap < acc*8/10 {
					t.Errorf("heap %d bytes, accounted %d: want heap in [0.8, 1] x accounted", heap, acc)
				}
				runtime.KeepAlive(s)
			})
		}
	}
}
