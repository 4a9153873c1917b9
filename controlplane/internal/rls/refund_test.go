package rls

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/controlplane/store/memory"
)

// refundDesc is a descriptor that gives cost back (is_negative_hits).
func refundDesc(cost uint64, pairs ...string) *ratelimitv3.RateLimitDescriptor {
	d := desc(pairs...)
	d.HitsAddend = wrapperspb.UInt64(cost)
	d.IsNegativeHits = true
	return d
}

// refundPolicy has one limit of each algorithm, 3 at once.
const refundPolicy = `
domain: refunds
response_headers: true
descriptors:
  - key: fixed_window
    failure_mode: closed
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: sliding_window
    rate_limit: {algorithm: sliding_window, unit: minute, requests_per_unit: 3}
  - key: sliding_log
    rate_limit: {algorithm: sliding_log, unit: minute, requests_per_unit: 3}
  - key: token_bucket
    rate_limit: {algorithm: token_bucket, unit: hour, requests_per_unit: 3}
  - key: gcra
    rate_limit: {algorithm: gcra, unit: hour, requests_per_unit: 3}
  - key: reserve
    rate_limit: {algorithm: reserve, unit: hour, requests_per_unit: 3, max_wait: 0s}
`

// TestRefunds: on every algorithm, a key used up refuses; a descriptor with
// is_negative_hits gives 2 back (OK, remaining 2, as envoyproxy/ratelimit
// answers a refund), and the next requests that fit are admitted at once.
// (reserve admits one more than its burst at once, paid for later: the
// refund first pays that back, so 1 remains, and 2 requests pass.)
func TestRefunds(t *testing.T) {
	c := &clock{}
	c.ns.Store(epoch.UnixNano())
	svc, err := New(memory.New(memory.Options{Now: c.Now}), parse(t, refundPolicy), Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	call := func(d *ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
		t.Helper()
		resp, err := svc.ShouldRateLimit(context.Background(), req("refunds", d))
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	for _, alg := range []string{"fixed_window", "sliding_window", "sliding_log", "token_bucket", "gcra", "reserve"} {
		k := alg + "=k"
		at, left := 3, uint32(2) // admitted at once; remaining after a refund of 2
		if alg == "reserve" {
			at, left = 4, 1
		}
		for range at {
			if r := call(desc(k)); r.OverallCode != ok {
				t.Fatalf("%s: refused before the limit: %v", alg, r)
			}
		}
		if r := call(desc(k)); r.OverallCode != over {
			t.Fatalf("%s: request %d passed: %v", alg, at+1, r)
		}
		r := call(refundDesc(2, k))
		if st := r.Statuses[0]; r.OverallCode != ok || st.Code != ok || st.LimitRemaining != left {
			t.Fatalf("%s: refund of 2 answered %v", alg, r)
		}
		if h := headerValue(r, HeaderRateLimit); !strings.Contains(h, fmt.Sprintf(";r=%d;", left)) {
			t.Errorf("%s: RateLimit header after the refund: %q", alg, h)
		}
		for i := range 2 {
			if r := call(desc(k)); r.OverallCode != ok {
				t.Fatalf("%s: request %d after the refund refused: %v", alg, i, r)
			}
		}
		if r := call(desc(k)); r.OverallCode != over {
			t.Fatalf("%s: the refund gave back more than 2: %v", alg, r)
		}
		// A refund of more than the key holds: never past a full limiter.
		call(refundDesc(100, k))
		for i := range at {
			if r := call(desc(k)); r.OverallCode != ok {
				t.Fatalf("%s: request %d after a refund of 100 refused: %v", alg, i, r)
			}
		}
		if r := call(desc(k)); r.OverallCode != over {
			t.Fatalf("%s: a refund of 100 left more than a full limiter: %v", alg, r)
		}
	}
	// A refund on a key that never counted anything gives nothing and is OK.
	if r := call(refundDesc(5, "fixed_window=fresh")); r.OverallCode != ok || r.Statuses[0].LimitRemaining != 3 {
		t.Fatalf("refund on a fresh key: %v", r)
	}
	// A refund descriptor beside a request's: each counted on its own.
	r, err := svc.ShouldRateLimit(context.Background(), req("refunds", desc("fixed_window=both"), refundDesc(1, "fixed_window=both")))
	if err != nil || r.OverallCode != ok || r.Statuses[1].LimitRemaining != 3 {
		t.Fatalf("request and refund in one call: %v %v", r, err)
	}
}

// TestRefundStoreFailure: a store that fails answers a refund OK whatever
// the limit's failure_mode (a refund refuses nothing); the request beside
// it follows failure_mode closed.
func TestRefundStoreFailure(t *testing.T) {
	svc, err := New(&failingStore{}, parse(t, refundPolicy), Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	r, err := svc.ShouldRateLimit(context.Background(), req("refunds", refundDesc(1, "fixed_window=k"), desc("fixed_window=k")))
	if err != nil {
		t.Fatal(err)
	}
	if r.Statuses[0].Code != ok || r.Statuses[1].Code != over {
		t.Fatalf("store down: refund %v, request %v; want OK and OVER_LIMIT (failure_mode closed)", r.Statuses[0].Code, r.Statuses[1].Code)
	}
}

// TestProbeOfUnusedKey: hits_addend 0 on a key that counted nothing
// (10/hour, 51 minutes before the hour ends) answers duration_until_reset
// the 51 minutes left in the window, as envoyproxy/ratelimit does, where a
// token bucket, full now, answers 0.
func TestProbeOfUnusedKey(t *testing.T) {
	c := &clock{}
	c.ns.Store(epoch.Add(9 * time.Minute).UnixNano())
	svc, err := New(memory.New(memory.Options{Now: c.Now}), parse(t, `
domain: probe
descriptors:
  - key: fw
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: tb
    rate_limit: {algorithm: token_bucket, unit: hour, requests_per_unit: 10}
`), Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	zero := func(d *ratelimitv3.RateLimitDescriptor) *ratelimitv3.RateLimitDescriptor {
		d.HitsAddend = wrapperspb.UInt64(0)
		return d
	}
	r, err := svc.ShouldRateLimit(context.Background(), req("probe", zero(desc("fw=unused")), zero(desc("tb=unused"))))
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Statuses[0].DurationUntilReset.AsDuration(); got != 51*time.Minute || r.Statuses[0].LimitRemaining != 10 {
		t.Errorf("fixed window probe: reset %v remaining %d, want 51m0s, 10", got, r.Statuses[0].LimitRemaining)
	}
	if got := r.Statuses[1].DurationUntilReset.AsDuration(); got != 0 {
		t.Errorf("token bucket probe: reset %v, want 0 (full now)", got)
	}
}

// headerValue returns the value of the header name the response adds, ""
// if none.
func headerValue(r *rlsv3.RateLimitResponse, name string) string {
	for _, h := range r.ResponseHeadersToAdd {
		if h.Key == name {
			return h.Value
		}
	}
	return ""
}
