package main

import (
	"fmt"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// codeOnlyCodec is the load tool's gRPC codec: gRPC's protobuf codec, except
// that a RateLimitResponse is read for its overall_code alone (the rest of
// the message is checked to be well-formed protobuf and skipped). The tool
// counts codes and nothing else, and decoding a whole response (sluice's
// dynamic_metadata is a Struct of maps) would spend the CPU the servers
// under test share with it.
type codeOnlyCodec struct{ base encoding.CodecV2 }

func newCodeOnlyCodec() codeOnlyCodec {
	return codeOnlyCodec{base: encoding.GetCodecV2(grpcproto.Name)}
}

func (c codeOnlyCodec) Name() string { return grpcproto.Name }

func (c codeOnlyCodec) Marshal(v any) (mem.BufferSlice, error) { return c.base.Marshal(v) }

func (c codeOnlyCodec) Unmarshal(data mem.BufferSlice, v any) error {
	r, ok := v.(*rlsv3.RateLimitResponse)
	if !ok {
		return c.base.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	code, err := overallCode(buf.ReadOnlyData())
	if err != nil {
		return err
	}
	r.Reset()
	r.OverallCode = code
	return nil
}

// overallCodeField is RateLimitResponse.overall_code's field number.
const overallCodeField = 1

// overallCode returns the overall_code of an encoded RateLimitResponse (the
// last one, as protobuf decoding keeps), or an error if b is not
// well-formed protobuf.
func overallCode(b []byte) (rlsv3.RateLimitResponse_Code, error) {
	var code rlsv3.RateLimitResponse_Code
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, fmt.Errorf("RateLimitResponse: %w", protowire.ParseError(n))
		}
		b = b[n:]
		if num == overallCodeField && typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return 0, fmt.Errorf("RateLimitResponse.overall_code: %w", protowire.ParseError(n))
			}
			code = rlsv3.RateLimitResponse_Code(int32(v))
			b = b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return 0, fmt.Errorf("RateLimitResponse field %d: %w", num, protowire.ParseError(n))
		}
		b = b[n:]
	}
	return code, nil
}
