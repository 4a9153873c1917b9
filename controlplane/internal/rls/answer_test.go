package rls

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/controlplane/store"
	"github.com/sluicehq/sluice/controlplane/store/memory"
	redisstore "github.com/sluicehq/sluice/controlplane/store/redis"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestResetWholeSeconds checks that duration_until_reset carries whole
// seconds, rounded up, as envoyproxy/ratelimit sends it: Envoy builds
// X-RateLimit-Reset from its seconds field alone. The RateLimit header's t
// says the same.
func TestResetWholeSeconds(t *testing.T) {
	f := newFixture(t, nil)
	f.clock.Advance(23 * time.Millisecond) // 59.977 s left in the minute
	resp := f.call(t, req("test", desc("user=erin"), desc("strict=s")))
	for i, want := range []int64{60, 1} { // a minute window, a second window
		d := resp.Statuses[i].DurationUntilReset
		if d.GetSeconds() != want || d.GetNanos() != 0 {
			t.Errorf("status[%d].duration_until_reset = %ds %dns, want %ds 0ns", i, d.GetSeconds(), d.GetNanos(), want)
		}
	}
	wantHeaders(t, "rounded", resp,
		`RateLimit-Policy: "per_user";q=3;w=60, "strict#0";q=5;w=1`,
		`RateLimit: "per_user";r=2;t=60, "strict#0";r=4;t=1`)
}

// costPolicy has one limit of capacity 10 per hour on each algorithm.
const costPolicy = `
domain: cost
response_headers: true
descriptors:
  - key: alg
    value: fixed_window
    rate_limit: {name: fw, unit: hour, requests_per_unit: 10}
  - key: alg
    value: sliding_window
    rate_limit: {name: sw, algorithm: sliding_window, unit: hour, requests_per_unit: 10}
  - key: alg
    value: sliding_log
    rate_limit: {name: sl, algorithm: sliding_log, unit: hour, requests_per_unit: 10}
  - key: alg
    value: token_bucket
    rate_limit: {name: tb, algorithm: token_bucket, unit: hour, requests_per_unit: 10}
  - key: alg
    value: gcra
    rate_limit: {name: gcra, algorithm: gcra, unit: hour, requests_per_unit: 10}
`

// TestRefusedAnswersNoRemaining checks the answer to a request a limit
// refuses, on every algorithm and on both stores: limit_remaining 0 (and
// r=0 in the RateLimit header) however much the limiter still holds, and
// nothing counted. A cost above the capacity has no retry time (no
// Retry-After; the reset is the limiter's own); a cost above what remains
// has one.
func TestRefusedAnswersNoRemaining(t *testing.T) {
	stores := map[string]func(t *testing.T, c *clock) store.Store{
		"memory": func(t *testing.T, c *clock) store.Store { return memory.New(memory.Options{Now: c.Now}) },
		"redis": func(t *testing.T, c *clock) store.Store {
			if testing.Short() {
				t.Skip("starts redis-server")
			}
			client := goredis.NewClient(&goredis.Options{Addr: redistest.StartServer(t).Addr()})
			t.Cleanup(func() { client.Close() })
			st, err := redisstore.New(client, redisstore.Options{Now: c.Now})
			if err != nil {
				t.Fatal(err)
			}
			return st
		},
	}
	algs := []string{"fixed_window", "sliding_window", "sliding_log", "token_bucket", "gcra"}
	names := map[string]string{"fixed_window": "fw", "sliding_window": "sw", "sliding_log": "sl", "token_bucket": "tb", "gcra": "gcra"}
	for _, stName := range []string{"memory", "redis"} {
		t.Run(stName, func(t *testing.T) {
			c := &clock{}
			c.ns.Store(epoch.UnixNano())
			svc, err := New(stores[stName](t, c), parse(t, costPolicy), Options{Logger: quiet, Registerer: prometheus.NewRegistry()})
			if err != nil {
				t.Fatal(err)
			}
			for _, alg := range algs {
				t.Run(alg, func(t *testing.T) {
					call := func(cost uint64) *rlsv3.RateLimitResponse {
						t.Helper()
						d := desc("alg=" + alg)
						d.HitsAddend = wrapperspb.UInt64(cost)
						resp, err := svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
							Domain: "cost", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
						if err != nil {
							t.Fatal(err)
						}
						return resp
					}
					name := names[alg]
					steps := []struct {
						cost      uint64
						code      rlsv3.RateLimitResponse_Code
						remaining uint32
						header    string // the RateLimit header's r, and whether Retry-After is sent
					}{
						{11, over, 0, "r=0 no-retry"}, // above the capacity: never passes, counts nothing
						{4, ok, 6, "r=6 no-retry"},
						{7, over, 0, "r=0 retry"}, // above what remains: refused, counts nothing
						{6, ok, 0, "r=0 no-retry"},
						{1, over, 0, "r=0 retry"},
					}
					for i, s := range steps {
						resp := call(s.cost)
						st := resp.Statuses[0]
						if resp.OverallCode != s.code || st.Code != s.code || st.LimitRemaining != s.remaining {
							t.Fatalf("step %d (cost %d): %v remaining %d, want %v remaining %d", i, s.cost, st.Code, st.LimitRemaining, s.code, s.remaining)
						}
						if d := st.DurationUntilReset; d.GetNanos() != 0 || d.GetSeconds() < 0 || d.GetSeconds() > 2*3600 {
							t.Errorf("step %d: duration_until_reset %v, want whole seconds within two windows (the sliding window's reach)", i, d.AsDuration())
						}
						got := headerMap(resp)
						retry := "no-retry"
						if _, ok := got[HeaderRetryAfter]; ok {
							retry = "retry"
						}
						wantR := fmt.Sprintf("%q;%s;", name, strings.Fields(s.header)[0])
						if !strings.HasPrefix(got[HeaderRateLimit], wantR) || retry != strings.Fields(s.header)[1] {
							t.Errorf("step %d (cost %d): RateLimit %q, %s; want prefix %s, %s", i, s.cost, got[HeaderRateLimit], retry, wantR, strings.Fields(s.header)[1])
						}
					}
				})
			}
		})
	}
}

// headerMap returns a response's headers to add by name.
func headerMap(resp *rlsv3.RateLimitResponse) map[string]string {
	m := make(map[string]string)
	for _, h := range resp.ResponseHeadersToAdd {
		m[h.Key] = h.Value
	}
	return m
}
