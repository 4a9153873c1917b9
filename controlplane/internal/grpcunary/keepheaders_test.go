package grpcunary

import (
	"context"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestKeepHeaders: a batch handler gets the headers Options.KeepHeaders
// names, in order, and no others; with none named it gets nil.
func TestKeepHeaders(t *testing.T) {
	for _, tc := range []struct {
		keep []string
		want string
	}{
		{[]string{"traceparent", "baggage"}, "traceparent=00-abc|baggage=k=v"},
		{nil, ""},
	} {
		srv := New(Options{KeepHeaders: tc.keep})
		srv.HandleBatch("/t.S/Headers", func(_ context.Context, calls []Call) {
			for i := range calls {
				var parts []string
				for _, h := range calls[i].Headers {
					parts = append(parts, h.Name+"="+h.Value)
				}
				if tc.keep == nil && calls[i].Headers != nil {
					parts = append(parts, "not nil")
				}
				calls[i].Resp, calls[i].Err = proto.Marshal(wrapperspb.String(strings.Join(parts, "|")))
			}
		})
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go srv.Serve(ln)
		cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", "00-abc", "x-other", "no", "baggage", "k=v")
		var out wrapperspb.StringValue
		if err := cc.Invoke(ctx, "/t.S/Headers", wrapperspb.String(""), &out); err != nil {
			t.Fatal(err)
		}
		if out.Value != tc.want {
			t.Errorf("keep %v: handler got %q, want %q", tc.keep, out.Value, tc.want)
		}
		cc.Close()
		srv.Stop()
	}
}
