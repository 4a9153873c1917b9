package store_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/store"
	"github.com/sluicehq/sluice/controlplane/store/memory"
)

// A request's limits decided in one call: a per-user fixed window and a
// per-tenant token bucket, on the in-process store (the Redis store is
// used the same way). Each check is decided on its own key.
func ExampleStore() {
	now := time.Date(2026, 11, 30, 12, 0, 30, 0, time.UTC)
	var st store.Store = memory.New(memory.Options{Now: func() time.Time { return now }})

	perUser := store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 2, Window: time.Minute}
	perTenant := store.Limit{Algorithm: algorithms.KindTokenBucket, Requests: 100, Window: time.Second, Burst: 200}
	checks := []store.Check{
		{Key: store.Key("api", []store.Entry{{Key: "user", Value: "alice"}}, "user#0", perUser.Algorithm), Limit: perUser, Cost: 1},
		{Key: store.Key("api", []store.Entry{{Key: "tenant", Value: "acme"}}, "tenant#0", perTenant.Algorithm), Limit: perTenant, Cost: 1},
	}
	out := make([]algorithms.Result, len(checks))
	for i := range 3 {
		if err := st.Decide(context.Background(), checks, out); err != nil {
			panic(err)
		}
		fmt.Printf("request %d: user allowed=%v remaining=%d retry after %v; tenant allowed=%v remaining=%d\n", i+1,
			out[0].Allowed, out[0].Remaining, time.Duration(out[0].RetryAfter), out[1].Allowed, out[1].Remaining)
	}
	// Output:
	// request 1: user allowed=true remaining=1 retry after 0s; tenant allowed=true remaining=199
	// request 2: user allowed=true remaining=0 retry after 0s; tenant allowed=true remaining=198
	// request 3: user allowed=false remaining=0 retry after 30s; tenant allowed=true remaining=197
}

// The key that holds a limit's state names what it counts: the domain, the
// descriptor's entries, the limit and its algorithm.
func ExampleKey() {
	fmt.Println(store.Key("api", []store.Entry{{Key: "user", Value: "alice"}}, "user#0", algorithms.KindFixedWindow))
	// Output:
	// sluice:{api:user=alice|user#0|fw}
}
