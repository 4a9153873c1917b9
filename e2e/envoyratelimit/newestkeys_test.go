package envoyratelimit

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/e2e/stack"
	"github.com/sluicehq/sluice/internal/redistest"
)

// newestKeysPolicy uses envoyproxy/ratelimit's newest keys (its main after
// the version Envoy Gateway v1.9.0 pins): quota_mode, metadata, and "*"
// inside a value (#1085).
const newestKeysPolicy = `
domain: newest
descriptors:
  - key: plan
    value: team-*-prod
    quota_mode: true
    metadata: {tier: premium, route: {region: eu, pool: a}}
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: plan
    value: free
    quota_mode: true
    metadata: {tier: free, route: {pool: b, zone: 1}, extra: x}
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: user
    metadata: {tier: user}
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: multi
    value: /v1/*/users/*/orders
    metadata: {matched: multi}
    rate_limit: {unit: day, requests_per_unit: 1}
`

// TestNewestKeysAgainstRatelimitMain sends the same ShouldRateLimit calls to
// sluice and to envoyproxy/ratelimit built from its main branch, both on
// newestKeysPolicy with response dynamic metadata on, and compares the
// overall code, each status's code and limit_remaining, and the metadata
// fields theirs sets. The module proxy does not serve their main, so the
// binary comes from $RATELIMIT_MAIN_BIN (go build ./src/service_cmd in a
// checkout); without it the test is skipped.
func TestNewestKeysAgainstRatelimitMain(t *testing.T) {
	bin := os.Getenv("RATELIMIT_MAIN_BIN")
	if bin == "" || testing.Short() {
		t.Skip("set RATELIMIT_MAIN_BIN to an envoyproxy/ratelimit binary built from its main branch")
	}
	if untilNext(time.Now(), 24*time.Hour) < time.Minute {
		t.Skip("within a minute of UTC midnight: the day windows would reset mid-test")
	}
	dir := t.TempDir()
	pol := filepath.Join(dir, "newest.yaml")
	if err := os.WriteFile(pol, []byte(newestKeysPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	cp, err := stack.StartControlPlane(context.Background(), stack.ControlPlaneConfig{Binary: controlPlane, Dir: dir,
		Policies: []string{pol}, RedisAddr: redistest.StartServer(t).Addr(), Args: []string{"-response-dynamic-metadata", "-deadline", "500ms"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cp.Stop() })
	theirs := startPeerBinary(t, bin, filepath.Join(dir, "peer"), redistest.StartServer(t).Addr(), newestKeysPolicy, "RESPONSE_DYNAMIC_METADATA=true")

	client := func(addr string) rlsv3.RateLimitServiceClient {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return rlsv3.NewRateLimitServiceClient(conn)
	}
	ours, peer := client(cp.GRPCAddr()), client(theirs)
	user := fmt.Sprintf("%d", time.Now().UnixNano())
	id := func(p string) string { return "plan=team-" + p + user + "-prod" }
	calls := []struct {
		descs []string
		// mutated: theirs merges metadata into the configuration's own
		// Structs, so once free's route was merged into team-*-prod's, theirs
		// answers the merged route for team-*-prod alone (a difference of the
		// table in docs/usage-based.md); sluice answers the configured one.
		mutated bool
	}{
		{descs: []string{id("a"), "user=" + user}},
		{descs: []string{id("a"), id("b")}},        // one quota over: OK
		{descs: []string{id("c"), "user=" + user}}, // a rate limit over: OVER_LIMIT
		{descs: []string{"multi=/v1/" + user + "/users/42/orders"}},
		{descs: []string{"multi=/v1/" + user + "/users/42/orders"}},
		{descs: []string{"multi=/v1/orders/users/" + user}}, // no match
		{descs: []string{id("e"), "plan=free"}},             // metadata merged
		{descs: []string{id("f")}, mutated: true},
		{descs: []string{id("a"), "plan=free"}}, // every quota over: OVER_LIMIT
	}
	var table strings.Builder
	for i, call := range calls {
		c := call.descs
		req := &rlsv3.RateLimitRequest{Domain: "newest"}
		for _, kv := range c {
			k, v, _ := strings.Cut(kv, "=")
			req.Descriptors = append(req.Descriptors, &ratelimitv3.RateLimitDescriptor{
				Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: k, Value: v}}})
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		a, err := ours.ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatalf("call %d: sluice: %v", i, err)
		}
		b, err := peer.ShouldRateLimit(ctx, req)
		cancel()
		if err != nil {
			t.Fatalf("call %d: envoyproxy/ratelimit: %v", i, err)
		}
		sa, sb := summary(a, false), summary(b, false)
		fmt.Fprintf(&table, "%d %v\n  sluice:               %s\n  envoyproxy/ratelimit: %s\n", i+1, c, summary(a, true), summary(b, true))
		if sa != sb {
			t.Errorf("call %d %v:\n sluice               %s\n envoyproxy/ratelimit %s", i+1, c, sa, sb)
		}
		for _, f := range []string{"domain", "descriptors", "hitsAddend", "metadata"} {
			x, y := a.GetDynamicMetadata().GetFields()[f], b.GetDynamicMetadata().GetFields()[f]
			switch same := proto.Equal(x, y); {
			case !same && !(call.mutated && f == "metadata"):
				t.Errorf("call %d %v: metadata %q:\n sluice               %v\n envoyproxy/ratelimit %v", i+1, c, f, x, y)
			case same && call.mutated && f == "metadata":
				t.Errorf("call %d %v: envoyproxy/ratelimit no longer keeps merged metadata in its configuration: update the differences table", i+1, c)
			}
		}
		if call.mutated {
			want := map[string]any{"tier": "premium", "route": map[string]any{"region": "eu", "pool": "a"}}
			if got := a.GetDynamicMetadata().GetFields()["metadata"].GetStructValue().AsMap(); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("call %d: sluice's metadata %v, want the configured %v", i+1, got, want)
			}
		}
	}
	t.Logf("the answers:\n%s", table.String())
}

// summary is the overall code and each status's code and limit_remaining
// of an answer, and with meta its merged metadata.
func summary(r *rlsv3.RateLimitResponse, meta bool) string {
	var b strings.Builder
	b.WriteString(r.GetOverallCode().String())
	for _, s := range r.GetStatuses() {
		fmt.Fprintf(&b, " [%s %d]", s.GetCode(), s.GetLimitRemaining())
	}
	if md := r.GetDynamicMetadata().GetFields()["metadata"]; md != nil && meta {
		fmt.Fprintf(&b, " metadata=%v", md.GetStructValue().AsMap())
	}
	return b.String()
}
