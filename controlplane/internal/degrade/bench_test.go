package degrade

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/store"
	"github.com/sluicehq/sluice/controlplane/store/memory"
)

// BenchmarkDecideHealthy is the healthy path's own cost: a primary that
// answers at once, the memory store as the fallback, answers that seed it
// (remaining 1 of 10) or not (remaining 9 of 10).
func BenchmarkDecideHealthy(b *testing.B) {
	for _, remaining := range []int64{1, 9} {
		b.Run(fmt.Sprintf("remaining=%d", remaining), func(b *testing.B) {
			primary := newFake("primary", remaining)
			s, err := New(primary, memory.New(memory.Options{}), Options{Probe: (&probeSwitch{}).probe,
				ProbeInterval: time.Hour, TrustContext: true, Logger: quiet})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			b.RunParallel(func(pb *testing.PB) {
				checks := make([]store.Check, 4)
				for i := range checks {
					checks[i] = store.Check{Key: fmt.Sprint("key-", i), Cost: 1,
						Limit: store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 10, Window: time.Minute}}
				}
				out := make([]algorithms.Result, len(checks))
				for pb.Next() {
					if err := s.Decide(context.Background(), checks, out); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}
