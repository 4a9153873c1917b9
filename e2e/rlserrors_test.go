package e2e

import (
	"context"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/e2e/stack"
)

// TestControlPlaneErrors: a control plane that answers with a gRPC error
// status (UNAVAILABLE, RESOURCE_EXHAUSTED, in a trailers-only answer as
// grpc-go sends it, or in the trailers after the headers) is a failed
// check on every host, and the plugin's failure_mode decides: Envoy 0
// fails open (200), Envoy 1 closed (503). The native module, whose
// callouts never see trailers, must still read each as a failure; an OK
// answer is still read as one.
func TestControlPlaneErrors(t *testing.T) {
	stack.ForEachFilter(t, filters, func(t *testing.T, f stack.Filter) {
		needStack(t)
		ctx := context.Background()
		rls, err := stack.StartFakeRLS("127.0.0.1:0", func(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
			key := ""
			if d := req.GetDescriptors(); len(d) > 0 && len(d[0].GetEntries()) > 0 {
				key = d[0].GetEntries()[0].GetValue()
			}
			switch key {
			case "unavailable":
				return nil, status.Error(codes.Unavailable, "the store is down")
			case "exhausted":
				return nil, status.Error(codes.ResourceExhausted, "too many callers")
			case "late":
				// Headers first: the status then goes in the trailers.
				if err := grpc.SendHeader(ctx, metadata.Pairs("x-sent", "first")); err != nil {
					return nil, err
				}
				return nil, status.Error(codes.Unavailable, "failed after the headers")
			}
			return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
				Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OK}}}, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		defer rls.Close()
		up, err := stack.StartUpstream("127.0.0.1:0", keyHeader)
		if err != nil {
			t.Fatal(err)
		}
		defer up.Close(ctx)
		open, closed := plugin(), plugin()
		closed.FailureMode, closed.StatusOnError = "closed", 503
		name := nextName()
		var addrs []string
		for i, s := range sharedEnvoys(t) {
			addr, err := s.configure(f, name, []stack.PluginConfig{open, closed}[i].JSON(), rls.Addr(), up.Addr())
			if err != nil {
				t.Fatal(err)
			}
			addrs = append(addrs, addr)
		}
		stat := func(gw int, name string) int64 { return sharedEnvoys(t)[gw].Stat(f.Stat(name)) }
		for gw, addr := range addrs {
			errs0, open0, closed0, allowed0 := stat(gw, "sluice.errors"), stat(gw, "sluice.failure_open"), stat(gw, "sluice.failure_closed"), stat(gw, "sluice.allowed")
			for _, key := range []string{"ok", "unavailable", "exhausted", "late"} {
				want := 200
				if key != "ok" && gw == 1 {
					want = 503
				}
				if r := sendTo("http://"+addr+"/", key); r.err != nil || r.status != want {
					t.Errorf("Envoy %d (failure_mode %s), key %s: %v status %d %q, want %d", gw, []string{"open", "closed"}[gw], key, r.err, r.status, r.body, want)
				}
			}
			errs, opened, closedN, allowed := stat(gw, "sluice.errors")-errs0, stat(gw, "sluice.failure_open")-open0,
				stat(gw, "sluice.failure_closed")-closed0, stat(gw, "sluice.allowed")-allowed0
			wantOpen, wantClosed := int64(3), int64(0)
			if gw == 1 {
				wantOpen, wantClosed = 0, 3
			}
			if errs != 3 || opened != wantOpen || closedN != wantClosed || allowed != 1 {
				t.Errorf("Envoy %d: errors %d, failed open %d, closed %d, allowed %d; want 3, %d, %d, 1", gw, errs, opened, closedN, allowed, wantOpen, wantClosed)
			}
		}
	})
}
