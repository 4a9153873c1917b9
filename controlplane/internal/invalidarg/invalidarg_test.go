package invalidarg

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
)

// raw sends a []byte as the request message, as it is.
type raw struct{}

func (raw) Name() string { return "proto" }
func (raw) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}
func (raw) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

// TestService: with Codec and Service, a unary or streaming request that
// does not decode is InvalidArgument, and one that does is served; grpc-go
// alone answers Internal.
func TestService(t *testing.T) {
	for _, c := range []struct {
		name    string
		wrapped bool
		want    codes.Code
	}{{"Codec and Service", true, codes.InvalidArgument}, {"grpc-go alone", false, codes.Internal}} {
		t.Run(c.name, func(t *testing.T) {
			var opts []grpc.ServerOption
			desc := &healthpb.Health_ServiceDesc
			if c.wrapped {
				opts = append(opts, grpc.ForceServerCodecV2(Codec(encoding.GetCodecV2(grpcproto.Name))))
				desc = Service(desc)
			}
			gs := grpc.NewServer(opts...)
			gs.RegisterService(desc, health.NewServer())
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			go gs.Serve(ln)
			defer gs.Stop()
			cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()

			garbage, out := []byte{0xff, 0xff, 0xff}, []byte(nil)
			err = cc.Invoke(ctx, "/grpc.health.v1.Health/Check", &garbage, &out, grpc.ForceCodecV2(raw{}))
			if status.Code(err) != c.want {
				t.Errorf("unary: %v; want %v", err, c.want)
			}
			s, err := cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, "/grpc.health.v1.Health/Watch", grpc.ForceCodecV2(raw{}))
			if err != nil {
				t.Fatal(err)
			}
			s.SendMsg(&garbage)
			s.CloseSend()
			if err := s.RecvMsg(&out); status.Code(err) != c.want {
				t.Errorf("streaming: %v; want %v", err, c.want)
			}
			r, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
			if err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
				t.Errorf("a good request: %v, %v", r, err)
			}
		})
	}
}
