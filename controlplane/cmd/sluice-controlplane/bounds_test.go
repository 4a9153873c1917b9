package main

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc"
	grpccodes "google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/controlplane/api/sluice/v1"
)

// TestBinaryLogFlood: 2,000 calls with a wrong token write a handful of
// refusal lines, not 2,000 (before logthrottle: one WARN line per call).
func TestBinaryLogFlood(t *testing.T) {
	const token = "test-token-0123456789abcdef"
	p, rec := startBinary(t, []string{"SLUICE_TOKEN=" + token}, "-policy", writePolicy(t, binPolicy))
	conn, err := grpc.NewClient(rec["policy"].(string), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	pc := sluicev1.NewPolicyServiceClient(conn)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer wrong-token-0123456789abcdef")
	const calls = 2000
	for range calls {
		if _, err := pc.List(ctx, &sluicev1.ListRequest{}); status.Code(err) != grpccodes.Unauthenticated {
			t.Fatalf("List with a wrong token: %v", err)
		}
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit %d:\n%s", code, p.output())
	}
	out := p.output()
	refused := strings.Count(out, `"msg":"policy service: refused a call"`)
	t.Logf("%d wrong-token calls: %d refusal lines, %d bytes of log", calls, refused, len(out))
	if refused > 20 {
		t.Errorf("%d refusal lines for %d calls, want at most 20", refused, calls)
	}
	if !strings.Contains(out, `"msg":"log lines suppressed: too many alike","message":"policy service: refused a call"`) {
		t.Errorf("no summary of the suppressed lines:\n%s", out)
	}
}
