package rlqs

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluicehq/sluice/controlplane/internal/connbounds"
	"github.com/sluicehq/sluice/controlplane/policy"
	"github.com/sluicehq/sluice/controlplane/store/memory"
)

const testPolicy = `
domain: api
descriptors:
  - key: name
    value: api
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: name
    value: tiny
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: name
    value: shadow
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: name
    value: free
    rate_limit: {unlimited: true}
  - key: env
    descriptors:
      - key: name
        rate_limit: {unit: minute, requests_per_unit: 600}
`

func parsePolicies(t *testing.T, src string) *policy.Set {
	t.Helper()
	d, err := policy.Parse("test.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	set, err := policy.NewSet(d)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// clock is a settable clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

func (c *clock) Add(d time.Duration) { c.mu.Lock(); c.now = c.now.Add(d); c.mu.Unlock() }

// fixture is a Service on a real gRPC listener.
type fixture struct {
	svc   *Service
	clock *clock
	addr  string
}

func newFixture(t *testing.T, opts Options, cfg ServerConfig) *fixture {
	t.Helper()
	f := &fixture{clock: &clock{now: time.Unix(1_800_000_000, 0)}}
	if opts.Now == nil {
		opts.Now = f.clock.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	st := memory.New(memory.Options{})
	svc, err := New(st, parsePolicies(t, testPolicy), opts)
	if err != nil {
		t.Fatal(err)
	}
	f.svc = svc
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := NewGRPCServer(svc, cfg)
	go gs.Serve(ln)
	t.Cleanup(gs.Stop)
	f.addr = ln.Addr().String()
	return f
}

func (f *fixture) open(t *testing.T) rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient {
	t.Helper()
	conn, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	s, err := rlqspb.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// usage is one bucket's usage in a report.
func usage(bucket map[string]string, allowed, denied uint64, elapsed time.Duration) *rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage {
	return &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
		BucketId: &rlqspb.BucketId{Bucket: bucket}, NumRequestsAllowed: allowed, NumRequestsDenied: denied,
		TimeElapsed: durationpb.New(elapsed),
	}
}

func report(domain string, us ...*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage) *rlqspb.RateLimitQuotaUsageReports {
	return &rlqspb.RateLimitQuotaUsageReports{Domain: domain, BucketQuotaUsages: us}
}

// exchange sends rep and returns the answer.
func exchange(t *testing.T, s rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient, rep *rlqspb.RateLimitQuotaUsageReports) *rlqspb.RateLimitQuotaResponse {
	t.Helper()
	if err := s.Send(rep); err != nil {
		t.Fatal(err)
	}
	resp, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// rateOfAction returns the token bucket rate of an assignment, or -1 for
// ALLOW_ALL and 0 for DENY_ALL; it checks what Envoy needs: whole-second
// fill interval and TTL.
func rateOfAction(t *testing.T, a *rlqspb.RateLimitQuotaResponse_BucketAction) float64 {
	t.Helper()
	q := a.GetQuotaAssignmentAction()
	if q == nil {
		t.Fatalf("action %v: not a quota assignment", a)
	}
	if ttl := q.GetAssignmentTimeToLive(); ttl.GetNanos() != 0 || ttl.GetSeconds() < 10 {
		t.Errorf("TTL %v: want whole seconds, well above the 5 s report interval", ttl.AsDuration())
	}
	switch s := q.GetRateLimitStrategy(); {
	case s.GetTokenBucket() != nil:
		tb := s.GetTokenBucket()
		if tb.GetFillInterval().GetNanos() != 0 || tb.GetFillInterval().GetSeconds() < 1 || tb.GetMaxTokens() < tb.GetTokensPerFill().GetValue() {
			t.Errorf("token bucket %v: want a whole-second fill interval and max_tokens of at least tokens_per_fill (both readings)", tb)
		}
		return float64(tb.GetTokensPerFill().GetValue()) / float64(tb.GetFillInterval().GetSeconds())
	case s.GetBlanketRule() == typev3.RateLimitStrategy_ALLOW_ALL:
		return -1
	case s.GetBlanketRule() == typev3.RateLimitStrategy_DENY_ALL && s.GetStrategy() != nil:
		return 0
	}
	t.Fatalf("strategy %v: want a token bucket or a blanket rule", a)
	return 0
}

// startRateOfAction is what a token bucket assignment that the client
// starts full (the first of a bucket, or after a blanket rule) admits over
// the report interval, saturated, per second: its burst and its rate.
// Other assignments are as rateOfAction.
func startRateOfAction(t *testing.T, a *rlqspb.RateLimitQuotaResponse_BucketAction) float64 {
	t.Helper()
	r := rateOfAction(t, a)
	if tb := a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket(); tb != nil {
		return (float64(tb.GetMaxTokens()) + r*ReportInterval.Seconds()) / ReportInterval.Seconds()
	}
	return r
}

// near reports whether got is want or at most 5% below it (BucketFor's
// whole tokens, StartBucketFor's burst).
func near(got, want float64) bool { return got <= want && got >= 0.95*want }

var api = map[string]string{"name": "api"}

// TestFirstReport: Envoy's first report of a bucket carries the request
// that created it and time_elapsed 0; alone, it gets the whole rate.
func TestFirstReport(t *testing.T) {
	f := newFixture(t, Options{}, ServerConfig{})
	s := f.open(t)
	resp := exchange(t, s, report("api", usage(api, 1, 0, 0)))
	if len(resp.GetBucketAction()) != 1 {
		t.Fatalf("got %d actions, want 1", len(resp.GetBucketAction()))
	}
	a := resp.GetBucketAction()[0]
	if a.GetBucketId().GetBucket()["name"] != "api" {
		t.Errorf("action for bucket %v, want the reported one", a.GetBucketId())
	}
	if got := startRateOfAction(t, a); !near(got, 100) {
		t.Errorf("alone, with unknown demand: %v/s over the first interval, want the whole 100/s", got)
	}
}

// TestShareBetweenStreams: two Envoys of one bucket divide the rate by
// their demand, measured between reports (time_elapsed 0 included). A
// newcomer while the first holds the whole rate borrows its fair share from
// the usage budget; each then takes what the other's assignment leaves.
func TestShareBetweenStreams(t *testing.T) {
	f := newFixture(t, Options{}, ServerConfig{})
	a, b := f.open(t), f.open(t)
	exchange(t, a, report("api", usage(api, 1, 0, 0)))
	if got := startRateOfAction(t, exchange(t, b, report("api", usage(api, 1, 0, 0))).GetBucketAction()[0]); !near(got, 50) {
		t.Errorf("second Envoy while the first holds the whole rate: %v/s, want its fair share lent, 50", got)
	}
	f.clock.Add(ReportInterval)
	// a: 100 requests in 5 s (20/s) but time_elapsed says 0: the server's
	// own clock measures the interval.
	ra := rateOfAction(t, exchange(t, a, report("api", usage(api, 90, 10, 0))).GetBucketAction()[0])
	if ra != 22 { // 20/s + 5% + 1
		t.Errorf("a at 20/s: %v/s, want 22 (its demand with headroom)", ra)
	}
	rb := rateOfAction(t, exchange(t, b, report("api", usage(api, 250, 250, 5*time.Second))).GetBucketAction()[0])
	if !near(rb, 78) {
		t.Errorf("b at 100/s: %v/s, want the remaining 78", rb)
	}
	if ra+rb > 100 {
		t.Errorf("shares %v + %v exceed the rate", ra, rb)
	}
}

// TestNoLimit: an unknown domain, a descriptor no policy matches, an
// unlimited limit and a shadow-mode limit are all allowed.
func TestNoLimit(t *testing.T) {
	f := newFixture(t, Options{}, ServerConfig{})
	for _, tc := range []struct {
		domain string
		bucket map[string]string
	}{
		{"nope", api},
		{"api", map[string]string{"name": "other"}},
		{"api", map[string]string{"name": "free"}},
		{"api", map[string]string{"name": "shadow"}},
	} {
		s := f.open(t)
		if got := rateOfAction(t, exchange(t, s, report(tc.domain, usage(tc.bucket, 1, 0, 0))).GetBucketAction()[0]); got != -1 {
			t.Errorf("%s %v: %v, want ALLOW_ALL", tc.domain, tc.bucket, got)
		}
	}
}

// TestEntriesSortedByKey: a bucket id's entries are matched as a
// descriptor sorted by key (env, then name).
func TestEntriesSortedByKey(t *testing.T) {
	f := newFixture(t, Options{}, ServerConfig{})
	s := f.open(t)
	got := startRateOfAction(t, exchange(t, s, report("api", usage(map[string]string{"name": "x", "env": "prod"}, 1, 0, 0))).GetBucketAction()[0])
	if !near(got, 10) { // 600 a minute
		t.Errorf("{env, name}: %v/s, want the env/name limit's 10/s", got)
	}
}

// TestDomainOnlyFirst: rlqs.proto says domain "should only be provided in
// the first report"; a later report without it is answered for the
// stream's domain (the api limit, not ALLOW_ALL), and counts nothing bad.
func TestDomainOnlyFirst(t *testing.T) {
	f := newFixture(t, Options{}, ServerConfig{})
	s := f.open(t)
	if got := startRateOfAction(t, exchange(t, s, report("api", usage(api, 1, 0, 0))).GetBucketAction()[0]); !near(got, 100) {
		t.Fatalf("first report: %v/s, want the api limit's 100/s", got)
	}
	for i := range 3 {
		f.clock.Add(ReportInterval)
		resp := exchange(t, s, report("", usage(api, 50, 0, ReportInterval)))
		if got := rateOfAction(t, resp.GetBucketAction()[0]); got <= 0 || got > 100 {
			t.Fatalf("report %d without domain: %v/s, want a share of the api limit", i+2, got)
		}
	}
	var m dto.Metric
	if err := f.svc.m.badReports.Write(&m); err != nil || m.GetCounter().GetValue() != 0 {
		t.Fatalf("bad reports counted: %v (%v)", m.GetCounter().GetValue(), err)
	}
}

// TestMalformed: a malformed report ends the stream with InvalidArgument
// naming the problem, and records nothing.
func TestMalformed(t *testing.T) {
	long := strings.Repeat("k", MaxEntryLen+1)
	big := map[string]string{}
	for i := range 5 {
		big[fmt.Sprint("k", i)] = strings.Repeat("v", MaxEntryLen)
	}
	many := map[string]string{}
	for i := range MaxEntries + 1 {
		many[string(rune('a'+i%26))+strings.Repeat("x", i)] = "v"
	}
	tests := []struct {
		name string
		reps []*rlqspb.RateLimitQuotaUsageReports
		want string
	}{
		{"no domain", []*rlqspb.RateLimitQuotaUsageReports{report("", usage(api, 1, 0, 0))}, "first report"},
		{"domain changes after one without", []*rlqspb.RateLimitQuotaUsageReports{report("api", usage(api, 1, 0, 0)), report("", usage(api, 1, 0, 0)), report("other", usage(api, 1, 0, 0))}, "one domain"},
		{"long domain", []*rlqspb.RateLimitQuotaUsageReports{report(strings.Repeat("d", MaxDomainLen+1), usage(api, 1, 0, 0))}, "domain"},
		{"no bucket id", []*rlqspb.RateLimitQuotaUsageReports{report("api", &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{})}, "bucket_id"},
		{"empty bucket id", []*rlqspb.RateLimitQuotaUsageReports{report("api", usage(map[string]string{}, 1, 0, 0))}, "bucket_id"},
		{"too many entries", []*rlqspb.RateLimitQuotaUsageReports{report("api", usage(many, 1, 0, 0))}, "entries"},
		{"bucket id past its bytes", []*rlqspb.RateLimitQuotaUsageReports{report("api", usage(big, 1, 0, 0))}, "bytes"},
		{"long key", []*rlqspb.RateLimitQuotaUsageReports{report("api", usage(map[string]string{long: "v"}, 1, 0, 0))}, "bucket_id"},
		{"empty key", []*rlqspb.RateLimitQuotaUsageReports{report("api", usage(map[string]string{"": "v"}, 1, 0, 0))}, "bucket_id"},
		{"negative elapsed", []*rlqspb.RateLimitQuotaUsageReports{report("api", usage(api, 1, 0, -time.Second))}, "time_elapsed"},
		{"domain changes", []*rlqspb.RateLimitQuotaUsageReports{report("api", usage(api, 1, 0, 0)), report("other", usage(api, 1, 0, 0))}, "one domain"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, Options{}, ServerConfig{})
			s := f.open(t)
			for _, r := range tt.reps[:len(tt.reps)-1] {
				exchange(t, s, r)
			}
			before := f.svc.local.Len()
			if err := s.Send(tt.reps[len(tt.reps)-1]); err != nil {
				t.Fatal(err)
			}
			_, err := s.Recv()
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want InvalidArgument naming %q", err, tt.want)
			}
			if len(tt.reps) == 1 && f.svc.local.Len() != before {
				t.Errorf("a refused report recorded demand")
			}
		})
	}
}

// TestMaxBuckets: past MaxBuckets a stream's new buckets get no
// assignment; known buckets still do.
func TestMaxBuckets(t *testing.T) {
	f := newFixture(t, Options{MaxBuckets: 2}, ServerConfig{})
	s := f.open(t)
	b := func(v string) map[string]string { return map[string]string{"name": v} }
	resp := exchange(t, s, report("api", usage(b("a"), 1, 0, 0), usage(b("b"), 1, 0, 0), usage(b("c"), 1, 0, 0)))
	if n := len(resp.GetBucketAction()); n != 2 {
		t.Fatalf("3 buckets with MaxBuckets 2: %d actions, want 2", n)
	}
	resp = exchange(t, s, report("api", usage(b("d"), 1, 0, 0), usage(b("a"), 1, 0, 0)))
	if n := len(resp.GetBucketAction()); n != 1 || resp.GetBucketAction()[0].GetBucketId().GetBucket()["name"] != "a" {
		t.Fatalf("a known and a new bucket at the bound: %v, want only the known one", resp.GetBucketAction())
	}
}

// TestMaxMessageSize: a report larger than the server's message bound is
// refused with ResourceExhausted.
func TestMaxMessageSize(t *testing.T) {
	f := newFixture(t, Options{}, ServerConfig{Bounds: connbounds.Bounds{MaxMsgBytes: 1024}})
	s := f.open(t)
	if err := s.Send(report("api", usage(map[string]string{"name": strings.Repeat("v", 2000)}, 1, 0, 0))); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("got %v, want ResourceExhausted", err)
	}
}

// TestMaxStreams: a connection carries at most MaxStreamsPerConn streams at once.
func TestMaxStreams(t *testing.T) {
	f := newFixture(t, Options{}, ServerConfig{Bounds: connbounds.Bounds{MaxStreamsPerConn: 1}})
	conn, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := rlqspb.NewRateLimitQuotaServiceClient(conn)
	first, err := c.StreamRateLimitQuotas(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	exchange(t, first, report("api", usage(api, 1, 0, 0)))
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	second, err := c.StreamRateLimitQuotas(ctx)
	if err == nil {
		second.Send(report("api", usage(api, 1, 0, 0)))
		_, err = second.Recv()
	}
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("second stream on a 1-stream connection: %v, want it to wait (DeadlineExceeded)", err)
	}
}

// TestBudgetSpent: usage beyond the limit's budget gets DENY_ALL.
func TestBudgetSpent(t *testing.T) {
	f := newFixture(t, Options{}, ServerConfig{})
	s := f.open(t)
	tiny := map[string]string{"name": "tiny"} // 10/s: a budget of 100
	if got := startRateOfAction(t, exchange(t, s, report("api", usage(tiny, 100, 0, 0))).GetBucketAction()[0]); !near(got, 10) {
		t.Fatalf("within the budget: %v/s, want 10", got)
	}
	if got := rateOfAction(t, exchange(t, s, report("api", usage(tiny, 100, 0, 0))).GetBucketAction()[0]); got != 0 {
		t.Fatalf("past the budget: %v, want DENY_ALL", got)
	}
}

// TestAbandonOnDelete: when a bucket's policy is deleted, its Envoy is told
// to abandon it; buckets without a limit are left alone.
func TestAbandonOnDelete(t *testing.T) {
	f := newFixture(t, Options{}, ServerConfig{})
	s := f.open(t)
	exchange(t, s, report("api", usage(api, 1, 0, 0), usage(map[string]string{"name": "other"}, 1, 0, 0)))
	f.svc.SetPolicies(parsePolicies(t, "domain: unrelated\ndescriptors: []\n"))
	resp, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetBucketAction()) != 1 || resp.GetBucketAction()[0].GetAbandonAction() == nil ||
		resp.GetBucketAction()[0].GetBucketId().GetBucket()["name"] != "api" {
		t.Fatalf("after deleting the policy: %v, want abandon_action for {name: api} only", resp)
	}
	if n := f.svc.local.Len(); n != 0 {
		t.Errorf("the abandoned bucket's demand is still held (%d buckets)", n)
	}
	// The bucket comes back as new; nothing limits it any more.
	if got := rateOfAction(t, exchange(t, s, report("api", usage(api, 1, 0, 0))).GetBucketAction()[0]); got != -1 {
		t.Errorf("re-created bucket: %v, want ALLOW_ALL", got)
	}
}

// TestStreamEndReleasesShare: a closed stream's share is free for the
// others at once; after Drain (a server that stops), it is kept one more
// report interval.
func TestStreamEndReleasesShare(t *testing.T) {
	for _, drain := range []bool{false, true} {
		f := newFixture(t, Options{}, ServerConfig{})
		a, b := f.open(t), f.open(t)
		exchange(t, a, report("api", usage(api, 1, 0, 0)))
		exchange(t, b, report("api", usage(api, 1, 0, 0)))
		f.clock.Add(ReportInterval)
		exchange(t, a, report("api", usage(api, 0, 1500, 0)))
		if drain {
			f.svc.Drain()
		}
		a.CloseSend()
		if _, err := a.Recv(); err == nil {
			t.Fatal("stream a still open")
		}
		waitFor(t, "a's stream closed", func() bool { return f.svc.streamCount() == 1 })
		want := 100.0
		if drain {
			want = 50
		}
		if got := rateOfAction(t, exchange(t, b, report("api", usage(api, 0, 1500, 0))).GetBucketAction()[0]); !near(got, want) {
			t.Errorf("drain %v: right after a's stream closed, b gets %v/s, want %v", drain, got, want)
		}
		f.clock.Add(ReportInterval + time.Second)
		if got := rateOfAction(t, exchange(t, b, report("api", usage(api, 0, 1500, 0))).GetBucketAction()[0]); got != 100 {
			t.Errorf("drain %v: a report interval later, b gets %v/s, want all 100", drain, got)
		}
	}
}

// TestBucketBudget: the buckets of all streams hold at most
// MaxBucketBytes, shared fairly by connection: a greedy connection gets no
// more than its share, another still gets its buckets (taking room from
// the greedy one, whose buckets are shed), and a closed stream's buckets
// count no more.
func TestBucketBudget(t *testing.T) {
	reg := prometheus.NewRegistry()
	x := func(v string) map[string]string { return map[string]string{"name": v} }
	cost := BucketCost(sortedEntries(x("a0")))
	f := newFixture(t, Options{MaxBucketBytes: 20 * cost, Registerer: reg}, ServerConfig{})
	greedy, other := f.open(t), f.open(t)
	var us []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage
	for i := range 20 {
		us = append(us, usage(x(fmt.Sprintf("a%d", i)), 1, 0, 0))
	}
	if n := len(exchange(t, greedy, report("api", us...)).GetBucketAction()); n != 10 {
		t.Fatalf("one connection alone asking for the whole budget: %d buckets, want half of it (10)", n)
	}
	// The other connection's share, now that two hold some, is a third:
	// it takes what is free, then room from the greedy one.
	us = us[:0]
	for i := range 6 {
		us = append(us, usage(x(fmt.Sprintf("b%d", i)), 1, 0, 0))
	}
	if n := len(exchange(t, other, report("api", us...)).GetBucketAction()); n != 6 {
		t.Fatalf("another connection under its share: %d of its 6 buckets answered, want all", n)
	}
	waitFor(t, "the greedy connection's buckets shed", func() bool { return counter(t, reg, "sluice_rlqs_buckets_shed_total") > 0 })
	f.svc.budget.mu.Lock()
	held := f.svc.budget.total - f.svc.budget.free
	f.svc.budget.mu.Unlock()
	if held > 20*cost {
		t.Errorf("the budget holds %d bytes, more than its %d", held, 20*cost)
	}
	greedy.CloseSend()
	greedy.Recv()
	waitFor(t, "the greedy stream's buckets released", func() bool {
		f.svc.budget.mu.Lock()
		defer f.svc.budget.mu.Unlock()
		return f.svc.budget.free == 14*cost
	})
}

// waitFor waits up to 5 s for cond (the server acts after its handler
// returns).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// counter returns the value of the counter name in reg.
func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}
