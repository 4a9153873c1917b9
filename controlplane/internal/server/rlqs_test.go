package server

import (
	"context"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/controlplane/internal/policystore"
)

// TestRLQSFollowsPolicies: with RLQSAddr set the server serves RLQS from
// its policies, and a domain deleted from the policy store reaches it as
// abandon_action, the way policy changes reach the RLS service.
func TestRLQSFollowsPolicies(t *testing.T) {
	srv := start(t, Config{Policies: policies(t), RLQSAddr: "127.0.0.1:0"})
	if srv.RLQSAddr() == "" {
		t.Fatal("RLQS is not served")
	}
	conn, err := grpc.NewClient(srv.RLQSAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := rlqspb.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bucket := &rlqspb.BucketId{Bucket: map[string]string{"user": "alice"}}
	if err := s.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: "srv", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{{BucketId: bucket, NumRequestsAllowed: 1}}}); err != nil {
		t.Fatal(err)
	}
	resp, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if tb := resp.GetBucketAction()[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket(); tb == nil {
		t.Fatalf("{user: alice} under a 2/minute limit: %v, want a token bucket", resp)
	}
	if _, err := srv.Policies().Delete(ctx, "srv", policystore.Guard{}); err != nil {
		t.Fatal(err)
	}
	resp, err = s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetBucketAction()) != 1 || resp.GetBucketAction()[0].GetAbandonAction() == nil {
		t.Fatalf("after deleting domain srv: %v, want abandon_action", resp)
	}
}

// TestRLQSOff: without RLQSAddr nothing listens for RLQS.
func TestRLQSOff(t *testing.T) {
	if srv := start(t, Config{Policies: policies(t)}); srv.RLQSAddr() != "" {
		t.Errorf("RLQSAddr() = %q, want none", srv.RLQSAddr())
	}
}
