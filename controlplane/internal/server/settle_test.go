package server

import (
	"context"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/controlplane/internal/rls"
)

// TestSettleOverListener runs once per decision server: a settlement sent
// with the x-sluice-settle header by grpc-go's client reaches the service
// (each server passes request headers its own way): charged once however
// often it is sent, a malformed token refused.
func TestSettleOverListener(t *testing.T) {
	for _, kind := range DecisionServers {
		t.Run(kind, func(t *testing.T) {
			srv := start(t, Config{Policies: policies(t), GRPCServer: kind})
			c := rlsv3.NewRateLimitServiceClient(dial(t, srv.GRPCAddr()))
			settle := func(token, user string, cost uint64) (*rlsv3.RateLimitResponse, error) {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if token != "" {
					ctx = metadata.AppendToOutgoingContext(ctx, rls.SettleHeader, token)
				}
				return c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "srv", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
					Entries:    []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: user}},
					HitsAddend: wrapperspb.UInt64(cost),
				}}})
			}
			// per_user is 2 a minute: three sends of one settlement of 1
			// leave 1; a fourth, new one leaves none (OVER_LIMIT).
			clearOfMinuteEnd()
			for i, want := range []struct {
				token     string
				code      rlsv3.RateLimitResponse_Code
				remaining uint32
			}{
				{"vm-1", rlsv3.RateLimitResponse_OK, 1},
				{"vm-1", rlsv3.RateLimitResponse_OK, 1},
				{"vm-1", rlsv3.RateLimitResponse_OK, 1},
				{"vm-2", rlsv3.RateLimitResponse_OVER_LIMIT, 0},
			} {
				resp, err := settle(want.token, "s", 1)
				if err != nil {
					t.Fatalf("send %d: %v", i, err)
				}
				if st := resp.Statuses[0]; st.Code != want.code || st.LimitRemaining != want.remaining {
					t.Fatalf("send %d (%s): %v remaining %d, want %v remaining %d", i, want.token, st.Code, st.LimitRemaining, want.code, want.remaining)
				}
			}
			if _, err := settle("bad token", "t", 1); status.Code(err) != codes.InvalidArgument {
				t.Fatalf("malformed token: %v, want InvalidArgument", err)
			}
			// Without the header the same call is a request of cost 1.
			if resp, err := settle("", "t", 1); err != nil || resp.Statuses[0].LimitRemaining != 1 {
				t.Fatalf("request of user t after a refused settlement: %v %v, want remaining 1", resp, err)
			}
			_, body := get(t, "http://"+srv.HTTPAddr()+"/metrics")
			for _, want := range []string{`sluice_settlements_total{result="applied"} 2`, `sluice_settlements_total{result="duplicate"} 2`,
				`sluice_memory_settle_tokens 2`} {
				if !strings.Contains(body, want) {
					t.Errorf("/metrics lacks %q", want)
				}
			}
		})
	}
}
