package core

import (
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/algorithms"
)

// globalLimit is the control plane's limiter in the retry tests: one of
// algorithms in nanoseconds, and the metadata the control plane
// reports for it.
type globalLimit struct {
	name  string
	allow func(now int64) algorithms.Result
	meta  map[string]any
}

func globalLimits() []globalLimit {
	second := int64(time.Second)
	fw := algorithms.FixedWindow{Limit: 5, Window: 10 * second, Aligned: true}
	var fws algorithms.FixedWindowState
	sl := algorithms.SlidingLog{Limit: 5, Window: 10 * second}
	sls := sl.NewState()
	sw := algorithms.SlidingWindow{Limit: 5, Window: 10 * second}
	var sws algorithms.SlidingWindowState
	tb := algorithms.TokenBucket{Rate: 1, Period: 3 * second, Burst: 4}
	var tbs algorithms.TokenBucketState
	gc := algorithms.GCRA{MaxBurst: 3, Count: 1, Period: 3 * second}
	var gcs algorithms.GCRAState
	must := func(r algorithms.Result, err error) algorithms.Result {
		if err != nil {
			panic(err)
		}
		return r
	}
	return []globalLimit{
		{"fixed_window", func(now int64) algorithms.Result { return must(fw.Allow(&fws, now, 1)) },
			map[string]any{"algorithm": "fixed_window", "limit": 5, "window_ms": 10000, "burst": 5}},
		{"sliding_log", func(now int64) algorithms.Result { return must(sl.Allow(sls, now, 1)) },
			map[string]any{"algorithm": "sliding_log", "limit": 5, "window_ms": 10000, "burst": 5}},
		{"sliding_window", func(now int64) algorithms.Result { return must(sw.Allow(&sws, now, 1)) },
			map[string]any{"algorithm": "sliding_window", "limit": 5, "window_ms": 10000, "burst": 5}},
		{"token_bucket", func(now int64) algorithms.Result { return must(tb.Allow(&tbs, now, 1)) },
			map[string]any{"algorithm": "token_bucket", "limit": 1, "window_ms": 3000, "burst": 4}},
		{"gcra", func(now int64) algorithms.Result { return must(gc.Allow(&gcs, now, 1)) },
			map[string]any{"algorithm": "gcra", "limit": 1, "window_ms": 3000, "burst": 4}},
	}
}

// retryClient drives one client through the plugin and a control plane
// that decides with a globalLimit.
type retryClient struct {
	t      *testing.T
	b      *testbed
	rng    *rand.Rand
	global globalLimit
	// decided and retryAt are the last denial's decision time and when the
	// global limiter allows the same request again.
	decided, retryAt int64
}

// send sends one request at the current time and returns its status (200
// or 429) and, for a 429, the local reply. A call to the control plane
// takes up to the timeout (25ms) in all, split at random between the way
// there and the way back.
func (c *retryClient) send() (int, fakeLocal) {
	c.t.Helper()
	h := c.b.host
	calls := len(h.calls)
	id, action := c.b.request(map[string]string{"x-api-key": "k1"}, "")
	if len(h.calls) == calls { // decided locally
		l, ok := h.local[id]
		if action != Pause || !ok || l.status != 429 || l.details != DetailsPrecheck {
			c.t.Fatalf("no call and no precheck 429: action %d, reply %+v", action, l)
		}
		return 429, l
	}
	total := c.rng.Int64N(int64(25*time.Millisecond) + 1)
	up := c.rng.Int64N(total + 1)
	h.now += up
	r := c.global.allow(h.now)
	meta := map[string]any{}
	for k, v := range c.global.meta {
		meta[k] = v
	}
	code := rlsv3.RateLimitResponse_OK
	if !r.Allowed {
		code = rlsv3.RateLimitResponse_OVER_LIMIT
		meta["retry_after_ms"] = float64(r.RetryAfter) / 1e6
		c.decided, c.retryAt = h.now, h.now+r.RetryAfter
	}
	h.now += total - up
	c.b.deliver(grpcOK(c.t, &rlsv3.RateLimitResponse{
		OverallCode: code,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{
			Code:               code,
			CurrentLimit:       &rlsv3.RateLimitResponse_RateLimit{Name: "per_key"},
			LimitRemaining:     uint32(r.Remaining),
			DurationUntilReset: durationpb.New(time.Duration(r.ResetAfter)),
		}},
		DynamicMetadata: metadata(c.t, meta),
	}))
	if r.Allowed {
		if h.resumed[id] != 1 {
			c.t.Fatalf("admitted by the control plane but resumed %d times", h.resumed[id])
		}
		return 200, fakeLocal{}
	}
	l, ok := h.local[id]
	if !ok || l.status != 429 || l.details != DetailsOverLimit {
		c.t.Fatalf("denied by the control plane, reply %+v", l)
	}
	return 429, l
}

// retryAfter returns a 429's Retry-After and checks that it and the
// RateLimit headers name the control plane's policy; a precheck 429's t is
// its Retry-After (the control plane's is its duration_until_reset).
func (c *retryClient) retryAfter(l fakeLocal) int64 {
	c.t.Helper()
	ra, _ := header(l.headers, "retry-after")
	secs, err := strconv.ParseInt(ra, 10, 64)
	if err != nil || secs < 1 {
		c.t.Fatalf("%s: Retry-After %q", l.details, ra)
	}
	pol, _ := header(l.headers, "ratelimit-policy")
	rl, _ := header(l.headers, "ratelimit")
	if !strings.HasPrefix(pol, `"per_key";`) || !strings.HasPrefix(rl, `"per_key";r=0;t=`) ||
		(l.details == DetailsPrecheck && rl != `"per_key";r=0;t=`+ra) {
		c.t.Fatalf("%s: RateLimit-Policy %q, RateLimit %q, Retry-After %s: want the policy \"per_key\" (and t = Retry-After from the precheck)",
			l.details, pol, rl, ra)
	}
	return secs
}

// TestRetryAfterIsEnoughForAClient checks that a client that waits exactly
// the Retry-After of a 429, whether the control plane or the precheck
// decided it, is admitted when it retries, for every algorithm and however
// the call's time splits between the way to the control plane and back.
// The precheck's 429s are sent at the worst times for a Retry-After that
// would count from the local block's end (which is up to two timeouts
// earlier than the control plane's retry time): just past a whole number
// of seconds before the true retry time.
func TestRetryAfterIsEnoughForAClient(t *testing.T) {
	for _, g := range globalLimits() {
		t.Run(g.name, func(t *testing.T) {
			c := &retryClient{t: t, b: newTestbed(t, retryConfig), rng: rand.New(rand.NewPCG(1, uint64(len(g.name)))), global: g}
			h := c.b.host
			prechecked := 0
			for round := 0; round < 100; round++ {
				// Requests until the control plane denies one.
				var l fakeLocal
				for n := 0; ; n++ {
					status, reply := c.send()
					if status == 429 {
						l = reply
						break
					}
					if n > 100 {
						t.Fatal("the control plane never denied")
					}
					h.now += c.rng.Int64N(int64(200 * time.Millisecond))
				}
				rejectedAt := h.now
				if round%2 == 1 {
					// Another request, answered by the precheck, at a time
					// just past a whole number of seconds before the retry
					// time (or at random when that is in the past).
					k := (c.retryAt - h.now) / int64(time.Second)
					at := c.retryAt - k*int64(time.Second) - int64(10*time.Millisecond)
					if k < 1 || at < h.now || c.rng.IntN(4) == 0 {
						at = h.now + c.rng.Int64N(c.retryAt-h.now)
					}
					h.now = at
					status, reply := c.send()
					if status != 429 {
						continue // the window moved on meanwhile (possible with random times)
					}
					if reply.details == DetailsPrecheck {
						prechecked++
					}
					l, rejectedAt = reply, h.now
				}
				secs := c.retryAfter(l)
				h.now = rejectedAt + secs*int64(time.Second)
				retried, retryAt := h.now, c.retryAt
				if status, reply := c.send(); status != 200 {
					t.Fatalf("round %d: a %s 429 said Retry-After %d; the retry then was refused (%s); the control plane allowed it from %v after the retry was sent",
						round, l.details, secs, reply.details, time.Duration(retryAt-retried))
				}
			}
			if prechecked < 30 {
				t.Fatalf("only %d precheck 429s checked", prechecked)
			}
		})
	}
}

const retryConfig = `{
  "cluster": "cp",
  "domain": "d",
  "timeout": "25ms",
  "rate_limits": [{"actions": [{"request_headers": {"header_name": "x-api-key", "descriptor_key": "api_key"}}]}],
  "headers": {"draft10": true, "retry_after": true}
}`

// TestRetryAfterCountsFromTheAnswer pins the arithmetic: the control plane
// decided 20ms after the request was sent and its answer came 5ms later;
// the local block ends at sent + retry-after - timeout - 1us, but the
// precheck's 429 tells the client the answer's arrival + retry-after.
func TestRetryAfterCountsFromTheAnswer(t *testing.T) {
	b := newTestbed(t, retryConfig)
	sent := b.host.now
	b.request(map[string]string{"x-api-key": "k1"}, "")
	b.host.now += int64(25 * time.Millisecond)
	b.deliver(grpcOK(t, &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{
			Code: rlsv3.RateLimitResponse_OVER_LIMIT, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Name: "per_key"},
		}},
		DynamicMetadata: metadata(t, map[string]any{"algorithm": "sliding_log", "limit": 5, "window_ms": 10000, "burst": 5, "retry_after_ms": 5000}),
	}))
	// 1.01s before sent + 25ms + 5s: the block (until sent + 4.975s) has
	// 0.965s left, but the client must wait 1.015s at least.
	b.host.now = sent + int64(25*time.Millisecond+5*time.Second-1010*time.Millisecond)
	id, _ := b.request(map[string]string{"x-api-key": "k1"}, "")
	l := b.host.local[id]
	if l.details != DetailsPrecheck {
		t.Fatalf("reply %+v, want a precheck 429", l)
	}
	for _, want := range [][2]string{
		{"retry-after", "2"},
		{"ratelimit-policy", `"per_key";q=5;w=10`},
		{"ratelimit", `"per_key";r=0;t=2`},
	} {
		if v, _ := header(l.headers, want[0]); v != want[1] {
			t.Errorf("%s = %q, want %q", want[0], v, want[1])
		}
	}
	// Past the block, the control plane is asked again.
	b.host.now = sent + int64(4975*time.Millisecond)
	calls := len(b.host.calls)
	if _, action := b.request(map[string]string{"x-api-key": "k1"}, ""); action != Pause || len(b.host.calls) != calls+1 {
		t.Fatalf("still blocked locally at the block's end")
	}
}
