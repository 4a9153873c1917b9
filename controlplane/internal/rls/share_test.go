package rls

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/store"
	"github.com/sluicehq/sluice/controlplane/store/memory"
	redisstore "github.com/sluicehq/sluice/controlplane/store/redis"
	"github.com/sluicehq/sluice/internal/redistest"
)

// sharePolicy is one domain per algorithm: a shared wildcard, the same
// wildcard unshared, and a shared wildcard above a per-user descriptor. Each
// limit admits 3 per hour.
func sharePolicy(alg algorithms.Kind) string {
	limit := fmt.Sprintf("{algorithm: %s, unit: hour, requests_per_unit: 3}", alg)
	return strings.NewReplacer("DOMAIN", "share-"+alg.String(), "LIMIT", limit).Replace(`
domain: DOMAIN
descriptors:
  - key: path
    value: "/files/*"
    share_threshold: true
    rate_limit: LIMIT
  - key: path
    value: "/own/*"
    rate_limit: LIMIT
  - key: tenant
    value: "t*"
    share_threshold: true
    descriptors:
      - key: user
        rate_limit: LIMIT
`)
}

// TestShareThreshold: every value a share_threshold wildcard matches counts
// against one counter, on every algorithm and on both stores; without
// share_threshold each value has its own; under a nested descriptor the
// shared level is shared and the level below is not.
func TestShareThreshold(t *testing.T) {
	algs := []algorithms.Kind{algorithms.KindFixedWindow, algorithms.KindSlidingWindow, algorithms.KindSlidingLog, algorithms.KindTokenBucket, algorithms.KindGCRA}
	var docs []string
	for _, a := range algs {
		docs = append(docs, sharePolicy(a))
	}
	set := parse(t, docs...)
	stores := map[string]func(*clock) store.Store{
		"memory": func(c *clock) store.Store { return memory.New(memory.Options{Now: c.Now}) },
		"redis": func(c *clock) store.Store {
			rs := redistest.StartServer(t)
			client := goredis.NewClient(&goredis.Options{Addr: rs.Addr()})
			t.Cleanup(func() { client.Close() })
			st, err := redisstore.New(client, redisstore.Options{Now: c.Now})
			if err != nil {
				t.Fatal(err)
			}
			return st
		},
	}
	for _, name := range []string{"memory", "redis"} {
		t.Run(name, func(t *testing.T) {
			c := &clock{}
			c.ns.Store(epoch.UnixNano())
			svc, err := New(stores[name](c), set, Options{Logger: quiet, Registerer: prometheus.NewRegistry()})
			if err != nil {
				t.Fatal(err)
			}
			f := &fixture{svc: svc, clock: c}
			for _, alg := range algs {
				domain := "share-" + alg.String()
				codes := func(ds ...[]string) string {
					var out []string
					for _, d := range ds {
						out = append(out, f.call(t, req(domain, desc(d...))).OverallCode.String())
					}
					return strings.Join(out, " ")
				}
				steps := []struct {
					what string
					got  string
					want string
				}{
					{"shared: four values, one counter",
						codes([]string{"path=/files/a"}, []string{"path=/files/b"}, []string{"path=/files/c"}, []string{"path=/files/d"}),
						"OK OK OK OVER_LIMIT"},
					{"unshared: a counter per value",
						codes([]string{"path=/own/a"}, []string{"path=/own/a"}, []string{"path=/own/a"}, []string{"path=/own/a"}, []string{"path=/own/b"}),
						"OK OK OK OVER_LIMIT OK"},
					{"nested: the tenants share, the users do not",
						codes([]string{"tenant=t1", "user=u"}, []string{"tenant=t2", "user=u"}, []string{"tenant=t3", "user=u"},
							[]string{"tenant=t4", "user=u"}, []string{"tenant=t1", "user=v"}),
						"OK OK OK OVER_LIMIT OK"},
				}
				for _, s := range steps {
					if s.got != s.want {
						t.Errorf("%s: %s: %s, want %s", alg, s.what, s.got, s.want)
					}
				}
			}
		})
	}
}
