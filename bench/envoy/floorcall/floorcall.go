// Package floorcall is the request the callout floors of bench-envoy send
// (setups 2h, 2g and 2n): sluice's RateLimitRequest for one user, as
// sluice's filter encodes it, by hand, so that the floors share nothing with
// the filter. It compiles for wasip1 (the empty Wasm filter) and natively
// (the empty native module).
package floorcall

import "encoding/binary"

// The callout's fixed names: bench-envoy's policy and cluster.
const (
	Cluster     = "rls"
	Domain      = "bench"
	TimeoutMs   = 100
	GRPCTimeout = "100m"
	Service     = "envoy.service.ratelimit.v3.RateLimitService"
	Method      = "ShouldRateLimit"
	Path        = "/" + Service + "/" + Method
)

// Headers are the request headers of the callout over HTTP/2, as sluice's
// filter sends them.
var Headers = [][2]string{
	{":method", "POST"},
	{":path", Path},
	{":authority", Cluster},
	{":scheme", "http"},
	{"content-type", "application/grpc"},
	{"te", "trailers"},
	{"grpc-timeout", GRPCTimeout},
}

// appendBytes appends a length-delimited protobuf field (short payloads).
func appendBytes(dst []byte, field byte, b []byte) []byte {
	dst = append(dst, field<<3|2)
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...)
}

// AppendRequest appends the RateLimitRequest for user to dst: domain
// "bench", one descriptor user=<user>, hits_addend 1 and sluice's quota
// field; framed as a gRPC message when framed (over HTTP), bare otherwise
// (Envoy's gRPC client frames it).
func AppendRequest(dst []byte, user []byte, framed bool) []byte {
	entry := appendBytes(appendBytes(nil, 1, []byte("user")), 2, user)
	desc := appendBytes(nil, 1, entry)
	msg := appendBytes(nil, 1, []byte(Domain))
	msg = appendBytes(msg, 2, desc)
	msg = append(msg, 3<<3, 1)          // hits_addend 1
	msg = append(msg, 0xc0, 0x3e, 0x01) // sluice's quota field (1000) = 1
	if framed {
		dst = append(dst, 0)
		dst = binary.BigEndian.AppendUint32(dst, uint32(len(msg)))
	}
	return append(dst, msg...)
}
