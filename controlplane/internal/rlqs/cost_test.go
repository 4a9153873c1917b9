package rlqs

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/controlplane/store/memory"
)

// heapInUse returns the bytes of live heap objects after a collection.
func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestBucketCost measures what a bucket holds once its report is answered:
// the bucket, its map entry, its entries, its demand and its usage key in
// the memory store (a limit applies to each). BucketCost must not be less,
// for ids of one short entry and ids at the bound (MaxBucketIDBytes in 64
// entries); the figures go in docs/design.md.
func TestBucketCost(t *testing.T) {
	if testing.Short() {
		t.Skip("measures the heap")
	}
	for _, tc := range []struct {
		name string
		id   func(i int) map[string]string
	}{
		{"small: {env, name}", func(i int) map[string]string {
			return map[string]string{"env": "prod", "name": fmt.Sprintf("user-%06d", i)}
		}},
		{"at the bound: 64 entries, 4 KiB", func(i int) map[string]string {
			id := map[string]string{"env": "prod", "name": fmt.Sprintf("user-%06d", i)}
			for k := len(id); k < MaxEntries; k++ {
				id[fmt.Sprintf("k%02d", k)] = strings.Repeat("v", MaxBucketIDBytes/MaxEntries-3)
			}
			return id
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 2000
			svc, err := New(memory.New(memory.Options{}), parsePolicies(t, testPolicy), Options{MaxBuckets: n, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			st := svc.openStream(nil, "client")
			before := heapInUse()
			for i := range n {
				if _, err := svc.handle(context.Background(), st, report("api", usage(tc.id(i), 1, 0, 0))); err != nil {
					t.Fatal(err)
				}
			}
			per := float64(heapInUse()-before) / n
			cost := BucketCost(sortedEntries(tc.id(0)))
			t.Logf("%s: %.0f bytes held per bucket; BucketCost %d", tc.name, per, cost)
			if per > float64(cost) {
				t.Errorf("a bucket holds %.0f bytes, more than its BucketCost %d", per, cost)
			}
			runtime.KeepAlive(svc)
		})
	}
}
