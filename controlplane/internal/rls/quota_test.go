package rls

import (
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	goredis "github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/controlplane/internal/lease"
	redisstore "github.com/sluicehq/sluice/controlplane/store/redis"
	"github.com/sluicehq/sluice/internal/redistest"
)

const quotaPolicy = `
domain: leased
lease: auto
descriptors:
  - key: k
    value: one
    rate_limit: {unit: second, requests_per_unit: 1000}
  - key: k
    value: two
    rate_limits:
      - {unit: second, requests_per_unit: 1000}
      - {unit: minute, requests_per_unit: 100000}
  - key: k
    value: shadow
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1000}
`

const unleasedPolicy = `
domain: plain
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1000}
`

// TestQuota: on a leased policy the control plane shares its lease with the
// caller in DescriptorStatus.quota (the share plus the request answered,
// valid until before the lease ends), only for a descriptor with one
// leased limit that is enforced; and every unit it answers or shares was
// leased from Redis first.
func TestQuota(t *testing.T) {
	rs := redistest.StartServer(t)
	client := goredis.NewClient(&goredis.Options{Addr: rs.Addr()})
	t.Cleanup(func() { client.Close() })
	c := &clock{}
	c.ns.Store(epoch.UnixNano())
	red, err := redisstore.New(client, redisstore.Options{Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	ls, err := lease.New(red, lease.Options{Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := New(ls, parse(t, quotaPolicy, unleasedPolicy), Options{Logger: quiet, Quota: ls})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{svc: svc, clock: c}
	counts := map[string]int{}
	var shared int64
	quotaReq := func(r *rlsv3.RateLimitRequest) *rlsv3.RateLimitRequest {
		r.ProtoReflect().SetUnknown(quotaMarker)
		return r
	}
	for i := range 300 {
		c.Advance(time.Millisecond)
		if i%10 == 0 { // a caller that does not spend quotas gets none
			if resp := f.call(t, req("leased", desc("k=one"))); resp.Statuses[0].Quota != nil {
				t.Fatal("a quota for a caller that did not ask")
			}
		}
		for _, v := range []string{"one", "two", "shadow"} {
			resp := f.call(t, quotaReq(req("leased", desc("k="+v))))
			if q := resp.Statuses[0].Quota; q != nil {
				counts[v]++
				if q.Requests < 2 {
					t.Fatalf("quota of %d requests", q.Requests)
				}
				shared += int64(q.Requests) - 1
				until := q.GetValidUntil().AsTime()
				if !until.After(time.Now()) || time.Until(until) > time.Second {
					t.Fatalf("valid until %v, now %v", until, time.Now())
				}
			}
		}
		if resp := f.call(t, quotaReq(req("plain", desc("k=x")))); resp.Statuses[0].Quota != nil {
			t.Fatal("a quota on a policy without lease: auto")
		}
	}
	if counts["one"] == 0 || counts["two"] != 0 || counts["shadow"] != 0 {
		t.Fatalf("quotas per descriptor: %v (want some for one, none for two limits or shadow mode)", counts)
	}
	st := ls.Stats()
	if st.Shared != shared || st.Granted < st.Local+st.Shared {
		t.Fatalf("stats %+v, quotas shared %d: units answered or shared that were not leased", st, shared)
	}
	// Over the limit: no quota.
	for range 2000 {
		resp := f.call(t, quotaReq(req("leased", desc("k=one"))))
		if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT && resp.Statuses[0].Quota != nil {
			t.Fatal("a quota on an over-limit answer")
		}
	}
	t.Logf("%d answers carried a quota, %d units shared; %+v", counts["one"], shared, st)
}

// TestQuotaFieldDecoded: the hand decoder keeps QuotaField, and a reused
// arena forgets it for the next request.
func TestQuotaFieldDecoded(t *testing.T) {
	r := req("d", desc("k=v"))
	plain, err := proto.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	marked := append(append([]byte{}, plain...), quotaMarker...)
	a := new(arena)
	got, err := decodeWire(marked, a)
	if err != nil || !acceptsQuota(got) || got.Domain != "d" {
		t.Fatalf("marked request: %v %v", got, err)
	}
	a.reset()
	if got, err = decodeWire(plain, a); err != nil || acceptsQuota(got) {
		t.Fatalf("plain request after a marked one: accepts %v, %v", acceptsQuota(got), err)
	}
	var viaProto rlsv3.RateLimitRequest
	if err := proto.Unmarshal(marked, &viaProto); err != nil || !acceptsQuota(&viaProto) {
		t.Fatalf("protobuf-go keeps the field as unknown: %v", err)
	}
	// The value names the caller (one per Envoy); 0 is no caller.
	for _, id := range []uint64{0, 1, 1 << 40, ^uint64(0)} {
		b := protowire.AppendVarint(protowire.AppendTag(append([]byte{}, plain...), QuotaField, protowire.VarintType), id)
		a.reset()
		got, err := decodeWire(b, a)
		if err != nil || quotaCaller(got) != id || acceptsQuota(got) != (id != 0) {
			t.Fatalf("caller %d: decoded %d, %v", id, quotaCaller(got), err)
		}
	}
}
