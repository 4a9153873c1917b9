package lease

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/store"
)

// dataPlane is one caller's pools in TestSharesFollowUse: what a filter
// holds of the shares a replica handed it, per key.
type dataPlane struct {
	pools map[string]*filterPool
	last  map[string]int64 // the size of the key's last share
}

// TestSharesFollowUse: a replica's shares follow what its caller spends.
// Keys used about once a second, spread over a fixed window of 1 s, get
// almost nothing (a lease they cannot use is lost to everyone and costs the
// data plane a pool); a key used 2,000 times a second by a data plane that
// calls again before its share runs out (prefetch) gets about what it
// spends (within 10%), never enough to reach a limit 50 times its rate.
func TestSharesFollowUse(t *testing.T) {
	const margin = 10 * time.Millisecond // rls quotaMargin
	l := store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 100_000, Window: time.Second, Lease: true}
	for _, c := range []struct {
		name      string
		keys      int
		rate      float64 // requests a second, each key
		seconds   int
		prefetch  float64 // the data plane calls when its pool holds less than this part of its last share
		maxShared float64 // units shared per request, at most
		minSpent  float64 // part of what was shared that was spent, at least
	}{
		{"spread", 500, 0.75, 20, 0, 0.10, 0},
		{"hot, prefetch", 1, 2000, 5, 0.2, 1.1, 0.9},
		{"hot", 1, 2000, 5, 0, 1.1, 0.9},
	} {
		t.Run(c.name, func(t *testing.T) {
			clk := &clock{}
			start := int64(1_700_000_000_000_000)
			clk.us.Store(start)
			r := replicas(t, 1, clk, Options{})[0]
			ctx := context.Background()
			rng := rand.New(rand.NewPCG(1, 2))
			type arrival struct {
				at  int64
				key string
			}
			var arrivals []arrival
			for k := range c.keys {
				at := float64(start)
				for {
					at += rng.ExpFloat64() / c.rate * 1e6
					if at >= float64(start)+float64(c.seconds)*1e6 {
						break
					}
					arrivals = append(arrivals, arrival{int64(at), fmt.Sprintf("k%d", k)})
				}
			}
			slices.SortFunc(arrivals, func(a, b arrival) int { return int(a.at - b.at) })
			dp := dataPlane{pools: map[string]*filterPool{}, last: map[string]int64{}}
			res := make([]algorithms.Result, 1)
			var shared, spent, refused int64
			call := func(key string, now int64) bool {
				if err := r.Decide(ctx, []store.Check{{Key: key, Limit: l, Cost: 1}}, res); err != nil {
					t.Fatal(err)
				}
				if !res[0].Allowed {
					refused++
					return false
				}
				if n, valid := r.Share(key, l, 20*time.Millisecond, 7); n > 0 {
					p := dp.pools[key]
					if p == nil || p.until <= now {
						p = &filterPool{}
						dp.pools[key] = p
					}
					p.units += n
					p.until = now + int64((valid-margin)/time.Microsecond)
					dp.last[key] = n
					shared += n
				}
				return true
			}
			for _, a := range arrivals {
				clk.us.Store(a.at)
				if p := dp.pools[a.key]; p != nil && p.units > 0 && p.until > a.at {
					p.units--
					spent++
					if c.prefetch > 0 && float64(p.units) < c.prefetch*float64(dp.last[a.key]) {
						call(a.key, a.at) // a renewal: its own unit joins the pool
						if q := dp.pools[a.key]; q != nil {
							q.units++
						}
					}
					continue
				}
				call(a.key, a.at)
			}
			n := float64(len(arrivals))
			t.Logf("%d requests: %.3f units shared a request, %.2f of them spent, %d refused", len(arrivals), float64(shared)/n,
				float64(spent)/max(float64(shared), 1), refused)
			if float64(shared)/n > c.maxShared || refused > 0 || float64(spent) < c.minSpent*float64(shared) {
				t.Errorf("shared %.3f units a request (at most %.2f), spent %.2f of them (at least %.2f), %d refused",
					float64(shared)/n, c.maxShared, float64(spent)/max(float64(shared), 1), c.minSpent, refused)
			}
		})
	}
}
