// Package invalidarg makes a grpc-go server refuse a request message that
// does not decode (garbage bytes, a string field of invalid UTF-8) with
// InvalidArgument, the client's error, rather than the Internal that grpc-go
// gives every codec failure: a client must not be told that the server
// failed when its own bytes are wrong.
//
// grpc-go wraps whatever error the codec returns as Internal, so the codec
// cannot say which it is. Instead the server's codec is wrapped with Codec,
// and its services are registered through Service: each method then
// decodes through Codec into a holder that keeps the codec's error, and
// turns that error into InvalidArgument itself.
//
//	gs := grpc.NewServer(grpc.ForceServerCodecV2(invalidarg.Codec(base)))
//	gs.RegisterService(invalidarg.Service(&pb.Foo_ServiceDesc), impl)
package invalidarg

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
)

// target is what a method of a Service decodes into: the message, and the
// codec's error, recorded by codec.Unmarshal instead of returned.
type target struct {
	msg any
	err error
}

// codec is Codec's result.
type codec struct{ base encoding.CodecV2 }

// Codec returns base, except that a message decoded for a method of a
// Service never fails in grpc-go: the failure is kept for the method, which
// answers InvalidArgument. Other decoding is base's.
func Codec(base encoding.CodecV2) encoding.CodecV2 { return codec{base} }

// Name implements encoding.CodecV2.
func (c codec) Name() string { return c.base.Name() }

// Marshal implements encoding.CodecV2.
func (c codec) Marshal(v any) (mem.BufferSlice, error) { return c.base.Marshal(v) }

// Unmarshal implements encoding.CodecV2.
func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	if t, ok := v.(*target); ok {
		t.err = c.base.Unmarshal(data, t.msg)
		return nil
	}
	return c.base.Unmarshal(data, v)
}

// Service returns a copy of desc whose methods, unary and streaming, refuse
// a request message that does not decode with InvalidArgument. The server
// must use Codec: without it, decoding fails in grpc-go as before
// (Internal), since grpc-go's codec cannot decode into the holder.
func Service(desc *grpc.ServiceDesc) *grpc.ServiceDesc {
	d := *desc
	d.Methods = make([]grpc.MethodDesc, len(desc.Methods))
	for i, m := range desc.Methods {
		h := m.Handler
		m.Handler = func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			return h(srv, ctx, func(v any) error { return decode(dec, v) }, ic)
		}
		d.Methods[i] = m
	}
	d.Streams = make([]grpc.StreamDesc, len(desc.Streams))
	for i, s := range desc.Streams {
		h := s.Handler
		s.Handler = func(srv any, stream grpc.ServerStream) error { return h(srv, recvStream{stream}) }
		d.Streams[i] = s
	}
	return &d
}

// decode receives one message into v with recv (grpc-go's decoder or
// RecvMsg) through Codec, and refuses one that does not decode.
func decode(recv func(any) error, v any) error {
	t := target{msg: v}
	if err := recv(&t); err != nil {
		return err
	}
	if t.err != nil {
		return status.Errorf(codes.InvalidArgument, "cannot decode the request message: %v", t.err)
	}
	return nil
}

// recvStream is a ServerStream whose RecvMsg goes through decode.
type recvStream struct{ grpc.ServerStream }

// RecvMsg implements grpc.ServerStream.
func (s recvStream) RecvMsg(m any) error { return decode(s.ServerStream.RecvMsg, m) }
