package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/e2e/stack"
)

// TestRedisKilledUnderLoad is scenario 4: Redis is killed (SIGKILL) while
// clients load both Envoys. No request fails or gets a 5xx: the control
// planes answer from their memory stores (degraded, still ready) at once,
// and the degraded limits apply, per replica: a limit of N admits N through
// each Envoy (each asks its own control plane). Once Redis is back, the
// control planes return to it, and a limit is again shared by both Envoys.
func TestRedisKilledUnderLoad(t *testing.T) {
	stack.ForEachFilter(t, filters, func(t *testing.T, f stack.Filter) {
		const tight = 5
		c := startCluster(t, clusterConfig{filter: f, policy: fmt.Sprintf(`
domain: e2e
descriptors:
  - key: api_key
    value: "load-*"
    rate_limit: {name: load, algorithm: token_bucket, unit: second, requests_per_unit: 2000, burst: 2000}
  - key: api_key
    value: "tight-*"
    rate_limit: {name: tight, algorithm: sliding_log, unit: minute, requests_per_unit: %d}
`, tight)})

		// phase counts what clients saw in each phase.
		type phase struct {
			name                  string
			ok, limited, bad, err atomic.Int64
			firstBad              atomic.Value // string
		}
		phases := []*phase{{name: "before the kill"}, {name: "Redis down"}, {name: "Redis restarted"}}
		var current atomic.Int32
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					p := phases[current.Load()]
					r := c.send(w%2, fmt.Sprintf("load-%d-%d", w, i%8))
					switch {
					case r.err != nil:
						p.err.Add(1)
						p.firstBad.CompareAndSwap(nil, r.err.Error())
					case r.status == 200:
						p.ok.Add(1)
					case r.status == 429:
						p.limited.Add(1)
					default:
						p.bad.Add(1)
						p.firstBad.CompareAndSwap(nil, fmt.Sprintf("status %d %q", r.status, r.body))
					}
				}
			})
		}
		stopLoad := func() {
			close(stop)
			wg.Wait()
		}
		// allDegraded reports whether every control plane says (in /readyz's
		// body) that it decides degraded, as want: /readyz stays 200 throughout.
		allDegraded := func(want bool) func() bool {
			return func() bool {
				for _, cp := range c.cps {
					ok, body := cp.Ready()
					if !ok || strings.Contains(body, "degraded") != want {
						return false
					}
				}
				return true
			}
		}

		time.Sleep(300 * time.Millisecond) // load on Redis
		current.Store(1)
		c.redis.Kill()
		killed := time.Now()
		if took, ok := waitFor(5*time.Second, allDegraded(true)); !ok {
			stopLoad()
			t.Fatalf("the control planes are not all ready and degraded %v after Redis was killed", took)
		} else {
			t.Logf("both control planes degraded (/readyz 200, degraded) %v after the kill", took.Round(time.Millisecond))
			if took > time.Second {
				t.Errorf("degrading took %v, want <= 1s", took)
			}
		}
		// The degraded limits apply while the load goes on: each control plane
		// admits the tight limit once from its own memory store, so each Envoy
		// admits it, whichever of its VMs asks.
		for gw := range 2 {
			admitted := 0
			for i := range 2 * tight {
				r := c.sendVM(gw, i%workers, "tight-down")
				switch r.status {
				case 200:
					admitted++
				case 429:
				default:
					t.Errorf("Redis down: Envoy %d: %v status %d %q", gw, r.err, r.status, r.body)
				}
			}
			if admitted != tight {
				t.Errorf("Redis down: a limit of %d admitted %d through Envoy %d, want %d (its control plane's memory store); %s",
					tight, admitted, gw, tight, c.filterErrors())
			}
		}
		if got := c.up.ByKey("tight-down"); got != 2*tight {
			t.Errorf("Redis down: the upstream saw %d requests for the tight key, want %d (the limit once per replica)", got, 2*tight)
		}
		time.Sleep(300 * time.Millisecond) // load while Redis is down
		current.Store(2)
		c.redis.Restart()
		restarted := time.Now()
		took, ok := waitFor(10*time.Second, allDegraded(false))
		if !ok {
			stopLoad()
			t.Fatalf("the control planes are not back on Redis %v after its restart", took)
		}
		t.Logf("both control planes back on Redis (/readyz: ready) %v after the restart (Redis was down %v)",
			took.Round(time.Millisecond), restarted.Sub(killed).Round(time.Millisecond))
		if took > 3*time.Second {
			t.Errorf("returning to Redis took %v, want <= 3s", took)
		}
		time.Sleep(300 * time.Millisecond) // load on Redis again
		stopLoad()

		for _, p := range phases {
			t.Logf("%s: %d ok, %d limited, %d 5xx or other, %d errors", p.name, p.ok.Load(), p.limited.Load(), p.bad.Load(), p.err.Load())
			if p.bad.Load() != 0 || p.err.Load() != 0 {
				t.Errorf("%s: %d bad answers and %d failed requests, first: %v", p.name, p.bad.Load(), p.err.Load(), p.firstBad.Load())
			}
			if p.ok.Load() < 10 {
				t.Errorf("%s: only %d requests answered", p.name, p.ok.Load())
			}
		}
		if d := c.cpMetric("sluice_store_degraded_decisions_total"); d == 0 {
			t.Error("no decision was counted as degraded while Redis was down")
		}
		if n := c.envoyStat("http." + c.listener + ".downstream_rq_5xx"); n != 0 {
			t.Errorf("Envoy answered %d requests with a 5xx", n)
		}
		if f := c.gwCounter("sluice.errors"); f != 0 {
			t.Errorf("the filter applied its failure mode %d times: the control planes should have answered", f)
		}

		// Back on Redis: the tight limit is shared again by both Envoys (per
		// replica memory stores would admit it on each), and its state is in
		// Redis.
		admitted := 0
		for i := range 2 * tight {
			if r := c.sendVM(i%2, (i/2)%workers, "tight-after"); r.status == 200 {
				admitted++
			}
		}
		if admitted != tight || c.up.ByKey("tight-after") != tight {
			t.Errorf("after Redis came back, a limit of %d admitted %d across both Envoys (the upstream saw %d); %s",
				tight, admitted, c.up.ByKey("tight-after"), c.filterErrors())
		}
		rdb := redis.NewClient(&redis.Options{Addr: c.redis.Addr()})
		defer rdb.Close()
		if n, err := rdb.DBSize(context.Background()).Result(); err != nil || n == 0 {
			t.Errorf("Redis holds %d keys after the restart (%v): decisions are not made there", n, err)
		}
	})
}
