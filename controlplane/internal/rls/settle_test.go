package rls

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/controlplane/store"
	"github.com/sluicehq/sluice/controlplane/store/memory"
	redisstore "github.com/sluicehq/sluice/controlplane/store/redis"
	"github.com/sluicehq/sluice/internal/redistest"
)

// settlePolicy: 250 tokens a minute per key, without charge_past_limit (a
// settlement charges past the limit anyway), and a token bucket.
const settlePolicy = `
domain: llm
descriptors:
  - key: key
    rate_limit: {unit: minute, requests_per_unit: 250}
  - key: bucket
    rate_limit: {algorithm: token_bucket, unit: minute, requests_per_unit: 250}
`

// settleStores are the stores the settlement tests run on; each returns
// two stores on the same state where the store is shared (two
// control-plane replicas on one Redis), the same store twice for memory.
var settleStores = map[string]func(t *testing.T, c *clock) (store.Store, store.Store){
	"memory": func(t *testing.T, c *clock) (store.Store, store.Store) {
		st := memory.New(memory.Options{Now: c.Now})
		return st, st
	},
	"redis": func(t *testing.T, c *clock) (store.Store, store.Store) {
		if testing.Short() {
			t.Skip("starts redis-server")
		}
		addr := redistest.StartServer(t).Addr()
		return settleRedis(t, goredis.NewClient(&goredis.Options{Addr: addr}), c),
			settleRedis(t, goredis.NewClient(&goredis.Options{Addr: addr}), c)
	},
	"redis-cluster": func(t *testing.T, c *clock) (store.Store, store.Store) {
		if testing.Short() {
			t.Skip("starts redis-server")
		}
		addrs := redistest.StartCluster(t, 3).Addrs()
		return settleRedis(t, goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: addrs}), c),
			settleRedis(t, goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: addrs}), c)
	},
}

// settleRedis returns a Redis store on client (closed with the test).
func settleRedis(t *testing.T, client goredis.UniversalClient, c *clock) store.Store {
	t.Cleanup(func() { client.Close() })
	st, err := redisstore.New(client, redisstore.Options{Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// settler sends settlements to a Service through one of the two ways a
// call's headers reach it: grpc-go's incoming metadata (ShouldRateLimit) or
// the unary server's batch (ShouldRateLimitBatch with WireCall.Settle).
type settler func(svc *Service, token []string, r *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error)

var settlers = map[string]settler{
	"grpc-go": func(svc *Service, token []string, r *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
		ctx := context.Background()
		if token != nil {
			md := metadata.MD{}
			md[SettleHeader] = token
			ctx = metadata.NewIncomingContext(ctx, md)
		}
		return svc.ShouldRateLimit(ctx, r)
	},
	"unary": func(svc *Service, token []string, r *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
		b, err := proto.Marshal(r)
		if err != nil {
			return nil, err
		}
		calls := []WireCall{{Req: b, Settle: token}}
		svc.ShouldRateLimitBatch(context.Background(), calls)
		if calls[0].Err != nil {
			return nil, calls[0].Err
		}
		var resp rlsv3.RateLimitResponse
		return &resp, proto.Unmarshal(calls[0].Resp, &resp)
	},
}

// settleReq returns a settlement request for domain llm of one descriptor
// per "entry=value:cost"; a cost of "-n" is a refund of n
// (is_negative_hits).
func settleReq(charges ...string) *rlsv3.RateLimitRequest {
	r := &rlsv3.RateLimitRequest{Domain: "llm"}
	for _, c := range charges {
		entry, cost, _ := strings.Cut(c, ":")
		d := desc(entry)
		cost, d.IsNegativeHits = strings.CutPrefix(cost, "-")
		var n uint64
		fmt.Sscan(cost, &n)
		d.HitsAddend = wrapperspb.UInt64(n)
		r.Descriptors = append(r.Descriptors, d)
	}
	return r
}

// newSettleService returns a Service on st with settlePolicy.
func newSettleService(t *testing.T, st store.Store) (*Service, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	svc, err := New(st, parse(t, settlePolicy), Options{Logger: quiet, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	return svc, reg
}

// settleReplicas returns two Services with settlePolicy on the store
// stName (sharing its state: two replicas), on a clock 40 s before a
// minute ends.
func settleReplicas(t *testing.T, stName string) (*clock, *Service, *Service) {
	t.Helper()
	c := &clock{}
	c.ns.Store(epoch.Add(20 * time.Second).UnixNano())
	st1, st2 := settleStores[stName](t, c)
	svc1, _ := newSettleService(t, st1)
	svc2, _ := newSettleService(t, st2)
	return c, svc1, svc2
}

// TestSettle is the contract of a settlement on every store and both ways
// in: a token charges once (a retry, through the other replica too,
// charges nothing and answers the key's state); another token charges
// again; a charge past the limit is taken, answered OVER_LIMIT with the
// time until a cost-1 request passes; a descriptor with no limit is OK and
// charges nothing; two descriptors of one batch on one key are two charges.
func TestSettle(t *testing.T) {
	for _, stName := range []string{"memory", "redis", "redis-cluster"} {
		for _, way := range []string{"grpc-go", "unary"} {
			t.Run(stName+"/"+way, func(t *testing.T) {
				c, svc1, svc2 := settleReplicas(t, stName)
				send := settlers[way]
				steps := []struct {
					svc       *Service
					token     string
					charges   []string
					codes     []rlsv3.RateLimitResponse_Code
					remaining []uint32
					reset     time.Duration // of the first status, when over limit
				}{
					{svc1, "vm1-1", []string{"key=a:100"}, []rlsv3.RateLimitResponse_Code{ok}, []uint32{150}, 0},
					{svc1, "vm1-1", []string{"key=a:100"}, []rlsv3.RateLimitResponse_Code{ok}, []uint32{150}, 0}, // a retry
					{svc2, "vm1-1", []string{"key=a:100"}, []rlsv3.RateLimitResponse_Code{ok}, []uint32{150}, 0}, // ...on the other replica
					{svc2, "vm1-2", []string{"key=a:100"}, []rlsv3.RateLimitResponse_Code{ok}, []uint32{50}, 0},
					// Exactly the limit: a cost-1 request would be refused.
					{svc1, "vm1-3", []string{"key=a:50"}, []rlsv3.RateLimitResponse_Code{over}, []uint32{0}, 40 * time.Second},
					// Past the limit: charged anyway (the usage happened).
					{svc1, "vm1-4", []string{"key=a:70", "nolimit=x:5"}, []rlsv3.RateLimitResponse_Code{over, ok}, []uint32{0, 0}, 40 * time.Second},
					{svc2, "vm1-4", []string{"key=a:70", "nolimit=x:5"}, []rlsv3.RateLimitResponse_Code{over, ok}, []uint32{0, 0}, 40 * time.Second},
					// Two charges of one batch on one key; a bucket in debt.
					{svc1, "vm2-1", []string{"key=b:100", "key=b:100", "bucket=c:300"}, []rlsv3.RateLimitResponse_Code{ok, ok, over}, []uint32{150, 50, 0}, 0},
				}
				for i, s := range steps {
					resp, err := send(s.svc, []string{s.token}, settleReq(s.charges...))
					if err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
					for k, st := range resp.Statuses {
						if st.Code != s.codes[k] || st.LimitRemaining != s.remaining[k] {
							t.Fatalf("step %d (%s %v) status %d: %v remaining %d, want %v remaining %d", i, s.token, s.charges, k, st.Code, st.LimitRemaining, s.codes[k], s.remaining[k])
						}
					}
					if s.reset > 0 {
						if got := resp.Statuses[0].DurationUntilReset.AsDuration(); got != s.reset {
							t.Fatalf("step %d: duration_until_reset %v, want %v", i, got, s.reset)
						}
					}
				}
				// The bucket's debt (300 of 250) leaves a cost-1 request
				// refused until 51 tokens are back: 51 x 240 ms = 12.24 s,
				// rounded up to whole seconds.
				// A retry of the whole batch charges none of it.
				resp, err := send(svc2, []string{"vm2-1"}, settleReq("key=b:100", "key=b:100", "bucket=c:300"))
				if err != nil {
					t.Fatal(err)
				}
				if b := resp.Statuses[1]; b.Code != ok || b.LimitRemaining != 50 {
					t.Fatalf("retried batch: key b %v remaining %d, want OK 50", b.Code, b.LimitRemaining)
				}
				if got := resp.Statuses[2].DurationUntilReset.AsDuration(); resp.Statuses[2].Code != over || got != 13*time.Second {
					t.Fatalf("bucket in debt: %v, reset %v, want OVER_LIMIT, 13s", resp.Statuses[2].Code, got)
				}
				// A request-time call (not a settlement) sees the settled usage.
				resp, err = send(svc1, nil, settleReq("key=a:0"))
				if err != nil || resp.OverallCode != over {
					t.Fatalf("request-time probe after the settlements: %v %v, want OVER_LIMIT", resp, err)
				}
				// The minute ends: the fixed window forgets the 320.
				c.Advance(40 * time.Second)
				resp, err = send(svc1, []string{"vm3-1"}, settleReq("key=a:1"))
				if err != nil || resp.Statuses[0].Code != ok || resp.Statuses[0].LimitRemaining != 249 {
					t.Fatalf("next window: %v %v, want OK remaining 249", resp, err)
				}
				// Descriptors applied: 4 (key a) + 3 (vm2-1) + 1 (vm3-1); the
				// nolimit descriptor charges nothing. Duplicates: 2 (vm1-1) +
				// 1 (vm1-4) + 3 (vm2-1).
				applied := value(t, svc1.metrics.Settlements.WithLabelValues(settleApplied))
				applied += value(t, svc2.metrics.Settlements.WithLabelValues(settleApplied))
				dups := value(t, svc1.metrics.Settlements.WithLabelValues(settleDuplicate))
				dups += value(t, svc2.metrics.Settlements.WithLabelValues(settleDuplicate))
				if applied != 8 || dups != 6 {
					t.Errorf("sluice_settlements_total: applied %v, duplicate %v; want 8, 6", applied, dups)
				}
			})
		}
	}
}

// TestSettleInvalid: a malformed token, the header sent twice, or more
// than 64 descriptors is refused with InvalidArgument and charges nothing.
func TestSettleInvalid(t *testing.T) {
	for way, send := range settlers {
		t.Run(way, func(t *testing.T) {
			c := &clock{}
			c.ns.Store(epoch.UnixNano())
			svc, _ := newSettleService(t, memory.New(memory.Options{Now: c.Now}))
			many := func(n int) []string {
				var cs []string
				for i := range n {
					cs = append(cs, fmt.Sprintf("key=k%d:1", i%3))
				}
				return cs
			}
			for _, bad := range []struct {
				token   []string
				charges []string
			}{
				{[]string{""}, many(1)},
				{[]string{"a b"}, many(1)},
				{[]string{"tok/1"}, many(1)},
				{[]string{"é"}, many(1)},
				{[]string{strings.Repeat("a", MaxSettleToken+1)}, many(1)},
				{[]string{"t-1", "t-2"}, many(1)},
				{[]string{"t-1"}, many(MaxSettleDescriptors + 1)},
			} {
				_, err := send(svc, bad.token, settleReq(bad.charges...))
				if status.Code(err) != codes.InvalidArgument {
					t.Fatalf("token %q, %d descriptors: %v, want InvalidArgument", bad.token, len(bad.charges), err)
				}
			}
			// Nothing was charged: every key is full; 64 descriptors pass.
			resp, err := send(svc, nil, settleReq("key=k0:0", "key=k1:0", "key=k2:0"))
			if err != nil {
				t.Fatal(err)
			}
			for i, st := range resp.Statuses {
				if st.LimitRemaining != 250 {
					t.Fatalf("key k%d: remaining %d after refused settlements, want 250", i, st.LimitRemaining)
				}
			}
			if _, err := send(svc, []string{strings.Repeat("a", MaxSettleToken)}, settleReq(many(MaxSettleDescriptors)...)); err != nil {
				t.Fatalf("64 descriptors, 64-byte token: %v", err)
			}
		})
	}
}

// TestSettleTokenDescriptorIndex: the token of a batch is applied per
// descriptor index, so a retry that carries the batch again charges none
// of it, and the same token with descriptors in another order is new.
func TestSettleTokenDescriptorIndex(t *testing.T) {
	svc, _ := newSettleService(t, memory.New(memory.Options{}))
	send := settlers["grpc-go"]
	for i, step := range []struct {
		charges []string
		want    []uint32
	}{
		{[]string{"key=a:10", "key=b:20"}, []uint32{240, 230}},
		{[]string{"key=a:10", "key=b:20"}, []uint32{240, 230}},
		{[]string{"key=b:20", "key=a:10"}, []uint32{210, 230}}, // index 0 is now key b: a new pair
	} {
		resp, err := send(svc, []string{"batch-9"}, settleReq(step.charges...))
		if err != nil {
			t.Fatal(err)
		}
		for k, st := range resp.Statuses {
			if st.LimitRemaining != step.want[k] {
				t.Fatalf("step %d status %d: remaining %d, want %d", i, k, st.LimitRemaining, step.want[k])
			}
		}
	}
}

// TestSettleStoreDown: a settlement that no store could decide is answered
// UNAVAILABLE, both ways in, never the failure mode's OK: the filter takes
// an answer as delivery, so an OK would lose the charge, while an error
// makes it send the batch again under the same token.
func TestSettleStoreDown(t *testing.T) {
	for way, send := range settlers {
		t.Run(way, func(t *testing.T) {
			st := &failingStore{}
			svc, _ := newSettleService(t, st)
			if _, err := send(svc, []string{"t-1"}, settleReq("key=k0:5", "key=k1:7")); status.Code(err) != codes.Unavailable {
				t.Fatalf("settlement with the store down: %v, want Unavailable", err)
			}
			if st.calls.Load() == 0 {
				t.Fatal("the store was not asked")
			}
			// A decision with the store down still follows its failure mode.
			if _, err := send(svc, nil, settleReq("key=k0:0")); err != nil {
				t.Fatalf("a decision with the store down: %v, want its failure mode's answer", err)
			}
		})
	}
}

// TestSettleRefunds: a settlement's refunds (is_negative_hits descriptors,
// the unused part of a reserve) are applied exactly once per (token,
// descriptor index), as its charges are, on every store and both ways in,
// through either replica; a refund and a charge of one batch on one key
// are both applied; a refund never leaves more than a full limiter.
func TestSettleRefunds(t *testing.T) {
	for _, stName := range []string{"memory", "redis", "redis-cluster"} {
		for _, way := range []string{"grpc-go", "unary"} {
			t.Run(stName+"/"+way, func(t *testing.T) {
				_, svc1, svc2 := settleReplicas(t, stName)
				send := settlers[way]
				steps := []struct {
					svc       *Service
					token     string
					charges   []string
					remaining []uint32
				}{
					{svc1, "s-1", []string{"key=a:200", "bucket=b:200"}, []uint32{50, 50}},
					{svc1, "s-2", []string{"key=a:-60", "bucket=b:-60"}, []uint32{110, 110}},
					{svc1, "s-2", []string{"key=a:-60", "bucket=b:-60"}, []uint32{110, 110}}, // a retry
					{svc2, "s-2", []string{"key=a:-60", "bucket=b:-60"}, []uint32{110, 110}}, // ...on the other replica
					// A stream settled with a charge and a refund on one key.
					{svc2, "s-3", []string{"key=a:30", "key=a:-10"}, []uint32{80, 90}},
					{svc1, "s-3", []string{"key=a:30", "key=a:-10"}, []uint32{90, 90}},
					// Never past full.
					{svc1, "s-4", []string{"key=a:-1000", "bucket=b:-1000"}, []uint32{250, 250}},
				}
				for i, s := range steps {
					resp, err := send(s.svc, []string{s.token}, settleReq(s.charges...))
					if err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
					for k, st := range resp.Statuses {
						if st.Code != ok || st.LimitRemaining != s.remaining[k] {
							t.Fatalf("step %d (%s %v) status %d: %v remaining %d, want OK remaining %d", i, s.token, s.charges, k, st.Code, st.LimitRemaining, s.remaining[k])
						}
					}
				}
				for _, m := range []struct {
					svc           *Service
					applied, dupl float64
				}{{svc1, 6, 4}, {svc2, 2, 2}} { // per descriptor: s-1, s-2, s-4 on one, s-3 on the other
					a := value(t, m.svc.Metrics().Settlements.WithLabelValues(settleApplied))
					d := value(t, m.svc.Metrics().Settlements.WithLabelValues(settleDuplicate))
					if a != m.applied || d != m.dupl {
						t.Errorf("settlements applied %v, duplicate %v; want %v, %v", a, d, m.applied, m.dupl)
					}
				}
			})
		}
	}
}
