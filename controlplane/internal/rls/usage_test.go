package rls

import (
	"context"
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

// usagePolicy limits tokens per hour with every algorithm, usage-based
// (charge_past_limit), and one request-priced limit for contrast.
const usagePolicy = `
domain: llm
descriptors:
  - key: tokens
    value: fixed_window
    charge_past_limit: true
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: tokens
    value: sliding_window
    charge_past_limit: true
    rate_limit: {algorithm: sliding_window, unit: hour, requests_per_unit: 100}
  - key: tokens
    value: sliding_log
    charge_past_limit: true
    rate_limit: {algorithm: sliding_log, unit: hour, requests_per_unit: 100}
  - key: tokens
    value: token_bucket
    charge_past_limit: true
    rate_limit: {algorithm: token_bucket, unit: hour, requests_per_unit: 100}
  - key: tokens
    value: gcra
    charge_past_limit: true
    rate_limit: {algorithm: gcra, unit: hour, requests_per_unit: 100}
  - key: requests
    rate_limit: {unit: hour, requests_per_unit: 100}
`

// usageStores are the stores the usage tests run on.
var usageStores = map[string]func(t *testing.T, c *clock) store.Store{
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

// usageCall sends one descriptor with a per-descriptor hits_addend, as
// Envoy does for a rate limit with hits_addend (0 at request time, the
// count at stream end).
func usageCall(t *testing.T, svc *Service, key, value string, hits uint64) *rlsv3.RateLimitResponse_DescriptorStatus {
	t.Helper()
	d := desc(key + "=" + value)
	d.HitsAddend = wrapperspb.UInt64(hits)
	resp, err := svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.OverallCode != resp.Statuses[0].Code {
		t.Fatalf("overall %v, status %v", resp.OverallCode, resp.Statuses[0].Code)
	}
	return resp.Statuses[0]
}

// TestResponseCost is the response-cost scenario (Envoy AI Gateway's token
// limits) on every algorithm and both stores: a request-time call with
// hits_addend 0 reports the true remaining, which falls as the stream-end
// calls charge tokens; a charge past the limit is taken; then request-time
// calls are refused (limit_remaining 0) until the window frees the usage.
// envoyproxy/ratelimit instead answers OK at exactly 0 remaining.
func TestResponseCost(t *testing.T) {
	for _, stName := range []string{"memory", "redis"} {
		t.Run(stName, func(t *testing.T) {
			for _, alg := range []string{"fixed_window", "sliding_window", "sliding_log", "token_bucket", "gcra"} {
				t.Run(alg, func(t *testing.T) {
					c := &clock{}
					c.ns.Store(epoch.UnixNano())
					svc, err := New(usageStores[stName](t, c), parse(t, usagePolicy), Options{Logger: quiet, Registerer: prometheus.NewRegistry()})
					if err != nil {
						t.Fatal(err)
					}
					expect := func(step string, st *rlsv3.RateLimitResponse_DescriptorStatus, code rlsv3.RateLimitResponse_Code, remaining uint32) {
						t.Helper()
						if st.Code != code || st.LimitRemaining != remaining {
							t.Fatalf("%s: %v remaining %d, want %v remaining %d", step, st.Code, st.LimitRemaining, code, remaining)
						}
					}
					expect("request-time check, fresh", usageCall(t, svc, "tokens", alg, 0), ok, 100)
					expect("stream end: 40 tokens", usageCall(t, svc, "tokens", alg, 40), ok, 60)
					expect("request-time check", usageCall(t, svc, "tokens", alg, 0), ok, 60)
					expect("stream end: 60 tokens, exactly the rest", usageCall(t, svc, "tokens", alg, 60), ok, 0)
					expect("request-time check at 0 remaining", usageCall(t, svc, "tokens", alg, 0), over, 0)
					expect("stream end of a request in flight: 30 tokens past the limit", usageCall(t, svc, "tokens", alg, 30), over, 0)
					st := usageCall(t, svc, "tokens", alg, 0)
					expect("request-time check in debt", st, over, 0)
					if st.DurationUntilReset.AsDuration() <= 0 {
						t.Fatalf("refused without a reset: %v", st.DurationUntilReset)
					}
					// The debt (130 of 100) is paid within two hours on every
					// algorithm: fixed windows forget it at the hour, the
					// others refill 100 an hour.
					c.Advance(2 * time.Hour)
					if st := usageCall(t, svc, "tokens", alg, 0); st.Code != ok || st.LimitRemaining == 0 {
						t.Fatalf("after two hours: %v remaining %d", st.Code, st.LimitRemaining)
					}
				})
			}
		})
	}
}

// TestChargeOnlyWhereUsage: without charge_past_limit a cost above what
// remains is refused and takes nothing (request pricing); with
// Options.ChargePastLimit every limit charges.
func TestChargeOnlyWhereUsage(t *testing.T) {
	for _, global := range []bool{false, true} {
		c := &clock{}
		c.ns.Store(epoch.UnixNano())
		svc, err := New(memory.New(memory.Options{Now: c.Now}), parse(t, usagePolicy), Options{Logger: quiet, Registerer: prometheus.NewRegistry(), ChargePastLimit: global})
		if err != nil {
			t.Fatal(err)
		}
		if st := usageCall(t, svc, "requests", "x", 90); st.Code != ok || st.LimitRemaining != 10 {
			t.Fatalf("global %v: 90 of 100: %v %d", global, st.Code, st.LimitRemaining)
		}
		if st := usageCall(t, svc, "requests", "x", 20); st.Code != over {
			t.Fatalf("global %v: 20 more: %v", global, st.Code)
		}
		st := usageCall(t, svc, "requests", "x", 0)
		switch {
		case !global && (st.Code != ok || st.LimitRemaining != 10):
			t.Fatalf("a refused request took its cost: %v remaining %d", st.Code, st.LimitRemaining)
		case global && (st.Code != over || st.LimitRemaining != 0):
			t.Fatalf("ChargePastLimit: the refused cost was not charged: %v remaining %d", st.Code, st.LimitRemaining)
		}
	}
}

// TestOvershootBound: requests admitted while usage remains, whose usage is
// charged later, overshoot the limit by at most their own usage (the
// requests in flight), and everything after is refused until the window
// frees it.
func TestOvershootBound(t *testing.T) {
	c := &clock{}
	c.ns.Store(epoch.UnixNano())
	svc, err := New(memory.New(memory.Options{Now: c.Now}), parse(t, usagePolicy), Options{Logger: quiet, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	usageCall(t, svc, "tokens", "fixed_window", 90) // 10 left
	const inFlight, each = 5, 15
	for i := range inFlight { // five requests start while 10 remain: all pass
		if st := usageCall(t, svc, "tokens", "fixed_window", 0); st.Code != ok || st.LimitRemaining != 10 {
			t.Fatalf("request %d at start: %v %d", i, st.Code, st.LimitRemaining)
		}
	}
	for range inFlight { // then they end, each having used 15 tokens
		usageCall(t, svc, "tokens", "fixed_window", each)
	}
	used := 90 + inFlight*each // 165: the overshoot (65) is at most inFlight*each (75)
	if over := used - 100; over > inFlight*each {
		t.Fatalf("overshoot %d past the bound %d", over, inFlight*each)
	}
	if st := usageCall(t, svc, "tokens", "fixed_window", 0); st.Code != over {
		t.Fatalf("after the overshoot: %v", st.Code)
	}
	c.Advance(time.Hour)
	if st := usageCall(t, svc, "tokens", "fixed_window", 0); st.Code != ok || st.LimitRemaining != 100 {
		t.Fatalf("next window: %v %d", st.Code, st.LimitRemaining)
	}
}
