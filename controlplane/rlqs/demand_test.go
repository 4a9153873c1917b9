package rlqs

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
)

// testDemand runs the Demand contract on d.
func testDemand(t *testing.T, d Demand) {
	ctx := context.Background()
	now := time.Unix(1_800_000_000, 0)
	ttl := 15 * time.Second
	got, err := d.Report(ctx, "k", "a", 20, now, ttl)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got["a"] != 20 {
		t.Fatalf("first report: %v", got)
	}
	got, _ = d.Report(ctx, "k", "b", math.Inf(1), now.Add(time.Second), ttl)
	if len(got) != 2 || got["a"] != 20 || !math.IsInf(got["b"], 1) {
		t.Fatalf("second Envoy: %v, want a 20 and b unknown", got)
	}
	got, _ = d.Report(ctx, "other", "a", 5, now, ttl)
	if len(got) != 1 {
		t.Fatalf("another key: %v, want only its own Envoy", got)
	}
	// a's report expires 15 s after it was made.
	got, _ = d.Report(ctx, "k", "b", 30, now.Add(ttl), ttl)
	if len(got) != 1 || got["b"] != 30 {
		t.Fatalf("after a's TTL: %v, want only b", got)
	}
	d.Report(ctx, "k", "c", 7, now.Add(ttl), ttl)
	if err := d.Forget(ctx, []string{"k", "other"}, "b"); err != nil {
		t.Fatal(err)
	}
	got, _ = d.Report(ctx, "k", "c", 8, now.Add(ttl+time.Second), ttl)
	if len(got) != 1 || got["c"] != 8 {
		t.Fatalf("after b is forgotten: %v, want only c", got)
	}
}

func TestMemoryDemand(t *testing.T) { testDemand(t, NewMemoryDemand()) }

func TestRedisDemand(t *testing.T) {
	srv := redistest.StartServer(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer c.Close()
	testDemand(t, NewRedisDemand(c))
	// The hash of a bucket expires with its reports.
	if ttl := c.PTTL(context.Background(), "k").Val(); ttl <= 0 || ttl > 30*time.Second {
		t.Errorf("the demand hash's TTL is %v, want at most 2 assignment TTLs", ttl)
	}
	// Garbage in a field is skipped, not trusted.
	c.HSet(context.Background(), "k", "junk", "not a demand")
	got, err := NewRedisDemand(c).Report(context.Background(), "k", "c", 1, time.Unix(1_800_000_017, 0), 15*time.Second)
	if err != nil || len(got) != 1 {
		t.Errorf("with a malformed field: %v, %v; want only c", got, err)
	}
}

// TestReplicasShareDemand: two services (two replicas) on one Redis divide
// one rate between their Envoys.
func TestReplicasShareDemand(t *testing.T) {
	srv := redistest.StartServer(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer c.Close()
	clk := &clock{now: time.Unix(1_800_000_000, 0)}
	mk := func() *fixture {
		f := newFixture(t, Options{Demand: NewRedisDemand(c), Now: clk.Now}, ServerConfig{})
		return f
	}
	r1, r2 := mk(), mk()
	a, b := r1.open(t), r2.open(t)
	exchange(t, a, report("api", usage(api, 1, 0, 0)))
	exchange(t, b, report("api", usage(api, 1, 0, 0)))
	clk.Add(ReportInterval)
	ra := rateOfAction(t, exchange(t, a, report("api", usage(api, 50, 0, 5*time.Second))).GetBucketAction()[0])
	rb := rateOfAction(t, exchange(t, b, report("api", usage(api, 400, 600, 5*time.Second))).GetBucketAction()[0])
	if ra != 11.5 || rb != 88.5 { // a: 10/s + 5% + 1; b the rest
		t.Errorf("replica 1's Envoy at 10/s got %v/s, replica 2's at 200/s got %v/s; want 11.5 and 88.5", ra, rb)
	}
}
