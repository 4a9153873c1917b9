package rlsproto

import (
	"encoding/binary"
	"strconv"
)

// gRPC status codes the filter distinguishes.
const (
	GRPCOK               = 0
	GRPCDeadlineExceeded = 4
	GRPCUnavailable      = 14
)

// ParseGRPCStatus parses the value of a grpc-status header or trailer.
func ParseGRPCStatus(v string) (code int, ok bool) {
	if v == "" || len(v) > 3 {
		return 0, false
	}
	n := 0
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

// AppendGRPCTimeout appends a timeout of ns nanoseconds as a grpc-timeout
// header value: at most eight digits and a unit, here whole milliseconds
// rounded up (or seconds when the milliseconds need more digits).
func AppendGRPCTimeout(dst []byte, ns int64) []byte {
	const ms, second = int64(1e6), int64(1e9)
	n := max((ns+ms-1)/ms, 1)
	if n <= 99999999 {
		return append(strconv.AppendInt(dst, n, 10), 'm')
	}
	n = min((ns+second-1)/second, 99999999)
	return append(strconv.AppendInt(dst, n, 10), 'S')
}

// The RLS service and method, as proxy_grpc_call names them.
const (
	ServiceName = "envoy.service.ratelimit.v3.RateLimitService"
	MethodName  = "ShouldRateLimit"
)

// AppendGRPCService appends an encoded envoy.config.core.v3.GrpcService
// that names Envoy's own gRPC client on cluster, with authority as the
// calls' :authority (cluster's name when empty): what proxy_grpc_call
// takes.
func AppendGRPCService(dst []byte, cluster, authority string) []byte {
	n := bytesFieldLen(len(cluster)) // EnvoyGrpc.cluster_name = 1
	if authority != "" {
		n += bytesFieldLen(len(authority)) // EnvoyGrpc.authority = 2
	}
	dst = binary.AppendUvarint(dst, tag(1, wireBytes)) // GrpcService.envoy_grpc = 1
	dst = binary.AppendUvarint(dst, uint64(n))
	dst = appendBytesField(dst, 1, cluster)
	if authority != "" {
		dst = appendBytesField(dst, 2, authority)
	}
	return dst
}
