package policyservice

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/controlplane/api/sluice/v1"
	"github.com/sluicehq/sluice/controlplane/internal/policystore"
	"github.com/sluicehq/sluice/internal/redistest"
)

// convergeBound is how soon a change must reach every replica's decisions.
const convergeBound = 2 * time.Second

// TestServiceCalls: each call's answers and error codes, with the messages
// an operator needs.
func TestServiceCalls(t *testing.T) {
	r := startReplica(t, newFileBackend(t), replicaConfig{auth: AuthConfig{Tokens: []string{testToken}}})
	c := r.policyClient(t, testToken)
	ctx := context.Background()

	res, err := c.Apply(ctx, &sluicev1.ApplyRequest{Yaml: domainYAML("api", 5), Source: "api.yaml", ExpectedVersion: proto.Uint64(0)})
	if err != nil || res.GetDomain() != "api" || res.GetUnchanged() {
		t.Fatalf("Apply = %v, %v", res, err)
	}
	v1 := res.GetVersion()
	again, err := c.Apply(ctx, &sluicev1.ApplyRequest{Yaml: domainYAML("api", 5)})
	if err != nil || !again.GetUnchanged() || again.GetVersion() != v1 {
		t.Fatalf("Apply of the same bytes = %v, %v; want unchanged at %d", again, err, v1)
	}

	_, err = c.Apply(ctx, &sluicev1.ApplyRequest{Source: "bad.yaml", Yaml: "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 5}\n"})
	wantCode(t, "invalid policy", err, codes.InvalidArgument,
		"nothing was changed", `bad.yaml:4: domain "api": descriptors[0].rate_limit.unit: `, `"fortnight"`)
	_, err = c.Apply(ctx, &sluicev1.ApplyRequest{Yaml: "descriptors: []\n"})
	wantCode(t, "no source", err, codes.InvalidArgument, "request:1: domain: required")
	_, err = c.Apply(ctx, &sluicev1.ApplyRequest{Yaml: domainYAML("api", 6), ExpectedVersion: proto.Uint64(v1 - 1)})
	wantCode(t, "stale version", err, codes.FailedPrecondition,
		fmt.Sprintf(`domain "api": expected version %d but the store has version %d`, v1-1, v1))
	_, err = c.Apply(ctx, &sluicev1.ApplyRequest{Yaml: domainYAML("api", 6), ExpectedVersion: proto.Uint64(0)})
	wantCode(t, "create-only on an existing domain", err, codes.FailedPrecondition, "expected the domain not to exist")
	_, err = c.Apply(ctx, &sluicev1.ApplyRequest{Yaml: domainYAML("api", 6), Source: "a\nb"})
	wantCode(t, "source with a newline", err, codes.InvalidArgument, "source: ")

	got, err := c.Get(ctx, &sluicev1.GetRequest{Domain: "api"})
	if err != nil || got.GetPolicy().GetYaml() != domainYAML("api", 5) || got.GetPolicy().GetVersion() != v1 || got.GetStoreVersion() != v1 {
		t.Fatalf("Get = %v, %v", got, err)
	}
	_, err = c.Get(ctx, &sluicev1.GetRequest{Domain: "nope"})
	wantCode(t, "Get of a missing domain", err, codes.NotFound, `domain "nope"`, "list")
	_, err = c.Get(ctx, &sluicev1.GetRequest{})
	wantCode(t, "Get without a domain", err, codes.InvalidArgument, "domain: required")

	res2, err := c.Apply(ctx, &sluicev1.ApplyRequest{Yaml: domainYAML("web", 7), Source: "web.yaml"})
	if err != nil {
		t.Fatal(err)
	}
	list, err := c.List(ctx, &sluicev1.ListRequest{})
	if err != nil || len(list.GetPolicies()) != 2 || list.GetPolicies()[0].GetDomain() != "api" ||
		list.GetPolicies()[1].GetVersion() != res2.GetVersion() || list.GetStoreVersion() != res2.GetVersion() {
		t.Fatalf("List = %v, %v", list, err)
	}

	_, err = c.Delete(ctx, &sluicev1.DeleteRequest{Domain: "api", ExpectedVersion: proto.Uint64(v1 + 100)})
	wantCode(t, "Delete with a stale version", err, codes.FailedPrecondition, "expected version")
	_, err = c.Delete(ctx, &sluicev1.DeleteRequest{Domain: "nope"})
	wantCode(t, "Delete of a missing domain", err, codes.NotFound, `domain "nope"`)
	_, err = c.Delete(ctx, &sluicev1.DeleteRequest{})
	wantCode(t, "Delete without a domain", err, codes.InvalidArgument, "domain: required")
	del, err := c.Delete(ctx, &sluicev1.DeleteRequest{Domain: "api", ExpectedVersion: proto.Uint64(v1)})
	if err != nil || del.GetStoreVersion() != res2.GetVersion()+1 {
		t.Fatalf("Delete = %v, %v", del, err)
	}
	if _, err := c.Get(ctx, &sluicev1.GetRequest{Domain: "api"}); err == nil {
		t.Fatal("Get after Delete found the domain")
	}
}

// TestWatch: a watcher first gets the whole set, then each change.
func TestWatch(t *testing.T) {
	r := startReplica(t, newFileBackend(t), replicaConfig{auth: AuthConfig{Tokens: []string{testToken}}})
	c := r.policyClient(t, testToken)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, err := c.Apply(ctx, &sluicev1.ApplyRequest{Yaml: domainYAML("api", 5)})
	if err != nil {
		t.Fatal(err)
	}
	stream, err := c.Watch(ctx, &sluicev1.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil || !first.GetSnapshot() || first.GetStoreVersion() != a.GetVersion() || len(first.GetApplied()) != 1 ||
		first.GetApplied()[0].GetYaml() != domainYAML("api", 5) {
		t.Fatalf("first message = %v, %v; want the current state", first, err)
	}
	w, err := c.Apply(ctx, &sluicev1.ApplyRequest{Yaml: domainYAML("web", 1)})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := stream.Recv()
	if err != nil || msg.GetSnapshot() || msg.GetStoreVersion() != w.GetVersion() || len(msg.GetApplied()) != 1 ||
		msg.GetApplied()[0].GetDomain() != "web" || len(msg.GetDeleted()) != 0 {
		t.Fatalf("after applying web: %v, %v", msg, err)
	}
	d, err := c.Delete(ctx, &sluicev1.DeleteRequest{Domain: "api"})
	if err != nil {
		t.Fatal(err)
	}
	msg, err = stream.Recv()
	if err != nil || msg.GetStoreVersion() != d.GetStoreVersion() || len(msg.GetApplied()) != 0 ||
		len(msg.GetDeleted()) != 1 || msg.GetDeleted()[0] != "api" {
		t.Fatalf("after deleting api: %v, %v", msg, err)
	}
	// A second watcher starts from the current state.
	s2, err := c.Watch(ctx, &sluicev1.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	m2, err := s2.Recv()
	if err != nil || !m2.GetSnapshot() || len(m2.GetApplied()) != 1 || m2.GetApplied()[0].GetDomain() != "web" {
		t.Fatalf("a new watcher's first message: %v, %v", m2, err)
	}
}

// cutDialer dials Redis for one replica and can cut it off: every open
// connection is closed and new dials fail until Restore, while Redis keeps
// serving the other replicas.
type cutDialer struct {
	mu    sync.Mutex
	cut   bool
	conns []net.Conn
}

// Dial is a go-redis Dialer.
func (d *cutDialer) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cut {
		return nil, errors.New("cut off from Redis by the test")
	}
	var nd net.Dialer
	c, err := nd.DialContext(ctx, network, addr)
	if err == nil {
		d.conns = append(d.conns, c)
	}
	return c, err
}

// Cut closes every connection and refuses new ones.
func (d *cutDialer) Cut() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.cut = true
	for _, c := range d.conns {
		c.Close()
	}
	d.conns = nil
}

// Restore lets dials through again.
func (d *cutDialer) Restore() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.cut = false
}

// redisBackend returns a Redis backend for addr, dialling through dialer
// when it is not nil.
func redisBackend(t testing.TB, addr string, dialer *cutDialer) policystore.Backend {
	t.Helper()
	opts := &redis.Options{Addr: addr}
	if dialer != nil {
		opts.Dialer = dialer.Dial
	}
	client := redis.NewClient(opts)
	t.Cleanup(func() { client.Close() })
	b, err := policystore.NewRedis(client, policystore.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// limitOf asks replica r's decision API about {user: x} of domain and
// returns the requests_per_unit it reports (0: no limit applies).
func limitOf(ctx context.Context, c rlsv3.RateLimitServiceClient, domain string) (uint32, error) {
	res, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain,
		Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "x"}}}}})
	if err != nil {
		return 0, err
	}
	return res.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(), nil
}

// waitLimit polls replica's decisions until domain's limit is want and
// returns how long that took; it fails after limit.
func waitLimit(t testing.TB, c rlsv3.RateLimitServiceClient, domain string, want uint32, limit time.Duration, what string) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		got, err := limitOf(context.Background(), c, domain)
		if err == nil && got == want {
			return time.Since(start)
		}
		if time.Since(start) > limit {
			t.Fatalf("%s: decisions report limit %d (%v) after %v; want %d", what, got, err, limit, want)
		}
		time.Sleep(5 * time.Millisecond) // polling real servers for a real change
	}
}

// TestDecisionsConverge: a policy applied over gRPC on replica A changes the
// decisions of replicas B and C within 2 s, also when B was cut off from
// Redis during the apply and came back.
func TestDecisionsConverge(t *testing.T) {
	srv := redistest.StartServer(t)
	auth := replicaConfig{auth: AuthConfig{Tokens: []string{testToken}}}
	cutB := &cutDialer{}
	a := startReplica(t, redisBackend(t, srv.Addr(), nil), auth)
	b := startReplica(t, redisBackend(t, srv.Addr(), cutB), auth)
	c := startReplica(t, redisBackend(t, srv.Addr(), nil), auth)
	admin := a.policyClient(t, testToken)
	ctx := context.Background()
	decB, decC := b.rlsClient(t), c.rlsClient(t)

	if _, err := admin.Apply(ctx, &sluicev1.ApplyRequest{Yaml: domainYAML("api", 10)}); err != nil {
		t.Fatal(err)
	}
	t.Logf("B's decisions changed in %v", waitLimit(t, decB, "api", 10, convergeBound, "replica B"))
	t.Logf("C's decisions changed in %v", waitLimit(t, decC, "api", 10, convergeBound, "replica C"))

	cutB.Cut()
	if _, err := admin.Apply(ctx, &sluicev1.ApplyRequest{Yaml: domainYAML("api", 20)}); err != nil {
		t.Fatal(err)
	}
	waitLimit(t, decC, "api", 20, convergeBound, "replica C while B is cut off")
	// B keeps deciding on the version it has.
	if got, err := limitOf(ctx, decB, "api"); err != nil || got != 10 {
		t.Fatalf("replica B while cut off: limit %d, %v; want the old 10", got, err)
	}
	cutB.Restore()
	d := waitLimit(t, decB, "api", 20, convergeBound, "replica B after the link came back")
	t.Logf("B's decisions changed %v after the link came back", d)

	// And B, back, serves Get of the same version as A.
	ga, err := admin.Get(ctx, &sluicev1.GetRequest{Domain: "api"})
	if err != nil {
		t.Fatal(err)
	}
	gb, err := b.policyClient(t, testToken).Get(ctx, &sluicev1.GetRequest{Domain: "api"})
	if err != nil || !proto.Equal(ga.GetPolicy(), gb.GetPolicy()) {
		t.Fatalf("Get on B = %v, %v; want A's %v", gb, err, ga)
	}
}

// TestConcurrentApplies: 100 Apply calls over gRPC at once on three
// replicas, all guarded by the same version: exactly one succeeds, the
// others fail with FailedPrecondition, and every replica decides on the
// winner's policy.
func TestConcurrentApplies(t *testing.T) {
	srv := redistest.StartServer(t)
	auth := replicaConfig{auth: AuthConfig{Tokens: []string{testToken}}}
	var reps []*replica
	var clients []sluicev1.PolicyServiceClient
	for range 3 {
		r := startReplica(t, redisBackend(t, srv.Addr(), nil), auth)
		reps = append(reps, r)
		clients = append(clients, r.policyClient(t, testToken))
	}
	ctx := context.Background()
	base, err := clients[0].Apply(ctx, &sluicev1.ApplyRequest{Yaml: domainYAML("api", 1)})
	if err != nil {
		t.Fatal(err)
	}
	const callers = 100
	type outcome struct {
		n   int
		res *sluicev1.ApplyResponse
		err error
	}
	out := make(chan outcome, callers)
	start := make(chan struct{})
	for i := range callers {
		go func() {
			<-start
			res, err := clients[i%3].Apply(ctx, &sluicev1.ApplyRequest{Yaml: domainYAML("api", 100+i),
				ExpectedVersion: proto.Uint64(base.GetVersion())})
			out <- outcome{100 + i, res, err}
		}()
	}
	close(start)
	winner, refused := -1, 0
	var winVersion uint64
	for range callers {
		o := <-out
		switch {
		case o.err == nil:
			if winner >= 0 {
				t.Fatalf("two winners: %d and %d", winner, o.n)
			}
			winner, winVersion = o.n, o.res.GetVersion()
		default:
			wantCode(t, "a losing Apply", o.err, codes.FailedPrecondition, "expected version")
			refused++
		}
	}
	if winner < 0 || refused != callers-1 {
		t.Fatalf("winner %d, %d refused; want one winner", winner, refused)
	}
	for i, r := range reps {
		waitLimit(t, r.rlsClient(t), "api", uint32(winner), convergeBound, fmt.Sprintf("replica %d", i))
		g, err := clients[i].Get(ctx, &sluicev1.GetRequest{Domain: "api"})
		if err != nil || g.GetPolicy().GetVersion() != winVersion || !strings.Contains(g.GetPolicy().GetYaml(), fmt.Sprint(winner)) {
			t.Fatalf("replica %d Get = %v, %v; want the winner's policy at version %d", i, g, err, winVersion)
		}
	}
}
