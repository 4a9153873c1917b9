package server

import (
	"context"
	"io"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/controlplane/internal/policyservice"
)

// rawCodec sends a []byte as the message, as it is: what a client with
// another encoder, or a hostile one, may send.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

// TestUndecodableRequests: a request message that does not decode (garbage
// bytes, a string field of invalid UTF-8) is the client's error,
// InvalidArgument, on the decision port in both server modes (decisions and
// health) and on the policy service (unary and streaming methods); it used
// to be Internal, which says the server failed.
func TestUndecodableRequests(t *testing.T) {
	garbage := []byte{0xff, 0xff, 0xff, 0xff}
	badUTF8 := []byte{0x0a, 0x02, 0xff, 0xfe} // field 1 (domain, service, yaml), a string of invalid UTF-8
	for _, kind := range DecisionServers {
		t.Run(kind, func(t *testing.T) {
			srv := start(t, Config{Policies: policies(t), GRPCServer: kind, PolicyAddr: "127.0.0.1:0",
				PolicyAuth: policyservice.AuthConfig{Tokens: []string{testPolicyToken}, Logger: quiet}})
			dec, pol := dial(t, srv.GRPCAddr()), dial(t, srv.PolicyAddr())
			calls := []struct {
				conn   *grpc.ClientConn
				method string
				stream bool
			}{
				{dec, "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", false},
				{dec, "/grpc.health.v1.Health/Check", false},
				{pol, "/sluice.v1.PolicyService/Apply", false},
				{pol, "/sluice.v1.PolicyService/Watch", true},
			}
			for _, c := range calls {
				if c.conn == pol && kind != GRPCServerGo && c.method != calls[2].method {
					continue // the policy service is the same grpc-go server in both modes: once is enough
				}
				for name, msg := range map[string][]byte{"garbage": garbage, "invalid UTF-8": badUTF8} {
					if c.stream && name == "invalid UTF-8" {
						msg = []byte{0x08, 0x80} // WatchRequest has no fields: a truncated varint instead
					}
					err := callRaw(c.conn, c.method, c.stream, msg)
					if status.Code(err) != codes.InvalidArgument {
						t.Errorf("%s, %s: %v; want InvalidArgument", c.method, name, err)
					}
				}
			}
			if got := ask(t, rlsv3.NewRateLimitServiceClient(dec), "a"); got.OverallCode != rlsv3.RateLimitResponse_OK {
				t.Errorf("a normal call after them: %v", got.OverallCode)
			}
		})
	}
}

// callRaw calls method on conn with msg as the request's bytes, with the
// policy service's token, and returns the call's error.
func callRaw(conn *grpc.ClientConn, method string, stream bool, msg []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+testPolicyToken)
	if !stream {
		var out []byte
		return conn.Invoke(ctx, method, &msg, &out, grpc.ForceCodecV2(rawCodec{}))
	}
	s, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, method, grpc.ForceCodecV2(rawCodec{}))
	if err != nil {
		return err
	}
	if err := s.SendMsg(&msg); err != nil {
		return err
	}
	s.CloseSend()
	var out []byte
	for {
		if err := s.RecvMsg(&out); err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
	}
}

// testPolicyToken is the policy service's bearer token in these tests.
const testPolicyToken = "0123456789abcdef0123456789abcdef"
