// Command rlsfloor is the transport floor of sluice's decision port: the
// same HTTP/2 server (controlplane/internal/grpcunary) and the same batch handling as
// sluice-controlplane, but every ShouldRateLimit is answered with one fixed
// OK answer, as long as sluice's (an OK status with its limit and sluice's
// metadata), without reading the request, deciding or calling Redis.
// bench/rls-compare.sh runs it as the system "floor": its CPU per call is what
// the server spends on gRPC over HTTP/2 under a given client, which no
// decision logic can go below.
//
//	rlsfloor -addr 127.0.0.1:8081
package main

import (
	"context"
	"flag"
	"log"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluicehq/sluice/controlplane/internal/grpcunary"
)

const method = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

func main() {
	addr := flag.String("addr", "127.0.0.1:8081", "the decision port to serve")
	flag.Parse()
	answer, err := fixedAnswer()
	if err != nil {
		log.Fatal(err)
	}
	srv := grpcunary.New(grpcunary.Options{})
	srv.HandleBatch(method, func(_ context.Context, calls []grpcunary.Call) {
		for i := range calls {
			calls[i].Resp = append(calls[i].Resp, answer...)
		}
	})
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
		<-sig
		srv.Stop()
	}()
	if err := srv.Serve(ln); err != nil && err != grpcunary.ErrServerStopped {
		log.Fatal(err)
	}
}

// fixedAnswer is an OK answer shaped like sluice's for one descriptor of
// the benchmark's policy.
func fixedAnswer() ([]byte, error) {
	meta, err := structpb.NewStruct(map[string]any{"sluice": []any{map[string]any{
		"algorithm": "fixed_window", "limit": 1e6, "window_ms": 1000, "failure_mode": "open", "name": "user#0",
	}}})
	if err != nil {
		return nil, err
	}
	return proto.Marshal(&rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{
			Code:               rlsv3.RateLimitResponse_OK,
			CurrentLimit:       &rlsv3.RateLimitResponse_RateLimit{Name: "user#0", RequestsPerUnit: 1e6, Unit: rlsv3.RateLimitResponse_RateLimit_SECOND},
			LimitRemaining:     999_999,
			DurationUntilReset: durationpb.New(time.Second),
		}},
		DynamicMetadata: meta,
	})
}
