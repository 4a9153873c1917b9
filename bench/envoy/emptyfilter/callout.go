//go:build wasip1

//lint:file-ignore U1000 the go:wasmexport functions are called by the host, which staticcheck cannot see

package main

import (
	"bytes"
	"unsafe"

	"github.com/sluicehq/sluice/bench/envoy/floorcall"
)

// The callout floor (setups 2h and 2g of bench-envoy): with {"callout":
// "http"} or {"callout": "grpc"} in its configuration, the empty filter
// makes the control-plane call of sluice's filter for every request and
// nothing else. It reads x-user, encodes the same RateLimitRequest (domain
// "bench", one descriptor user=<x-user>, hits_addend 1 and sluice's quota
// field), sends it to cluster "rls" with a 100 ms timeout, pauses the
// request, and on the answer, whatever it is, resumes it. "http" sends it
// as sluice's filter does, through proxy_http_call with the same headers;
// "grpc" through proxy_grpc_call, Envoy's gRPC async client (the one
// Envoy's own ratelimit filter uses).
//
// The proxy delivers a call's answer to the root context (proxy-wasm hosts
// own calls by the root), so the floor keeps each call's stream and makes
// it the effective context before resuming: the same host calls any
// proxy-wasm filter needs to resume a request after a call.

// callout is the configured mode: 0 none, calloutHTTP or calloutGRPC.
var callout int

// readAnswer, with "read":true, reads the answer as the least a filter
// must to decide on it: over HTTP its :status, its grpc-status trailer and
// its body; over gRPC its message (Envoy's client has checked the status).
var readAnswer bool

const (
	calloutHTTP = 1
	calloutGRPC = 2
)

// The callout's buffers, built once, and its calls in flight (call id to
// stream context id).
var (
	calloutHeaders  []byte // serialized request headers of proxy_http_call
	calloutTrailers []byte // an empty map
	calloutService  []byte // serialized GrpcService{envoy_grpc{cluster_name}}
	calloutMetadata []byte // an empty map
	calloutBody     []byte
	calls           = map[uint32]uint32{}
	callID          uint32
)

// configureCallout reads the mode from the plugin configuration.
func configureCallout(conf []byte) {
	switch {
	case bytes.Contains(conf, []byte(`"callout":"http"`)):
		callout = calloutHTTP
	case bytes.Contains(conf, []byte(`"callout":"grpc"`)):
		callout = calloutGRPC
	default:
		return
	}
	readAnswer = bytes.Contains(conf, []byte(`"read":true`))
	calloutHeaders = appendPairs(nil, floorcall.Headers)
	calloutTrailers = appendPairs(nil, nil)
	calloutMetadata = appendPairs(nil, nil)
	// GrpcService field 1 (envoy_grpc), EnvoyGrpc field 1 (cluster_name).
	inner := append([]byte{0x0a, byte(len(floorcall.Cluster))}, floorcall.Cluster...)
	calloutService = append([]byte{0x0a, byte(len(inner))}, inner...)
}

// encodeRequest fills calloutBody with the RateLimitRequest for user, as a
// gRPC frame for HTTP and bare for gRPC (Envoy's client frames it).
func encodeRequest(user []byte) {
	calloutBody = floorcall.AppendRequest(calloutBody[:0], user, callout == calloutHTTP)
}

// callOut sends the request's call and pauses it (continues it when the
// call cannot be made).
func callOut(id uint32) uint32 {
	var d, sz uint32
	var user []byte
	if proxyGetHeaderMapValue(0, "x-user", &d, &sz) == 0 {
		user = unsafe.Slice((*byte)(unsafe.Add(nil, uintptr(d))), sz)
	}
	encodeRequest(user)
	var st uint32
	if callout == calloutHTTP {
		st = proxyHTTPCall(floorcall.Cluster, unsafe.Pointer(&calloutHeaders[0]), uint32(len(calloutHeaders)),
			unsafe.Pointer(&calloutBody[0]), uint32(len(calloutBody)),
			unsafe.Pointer(&calloutTrailers[0]), uint32(len(calloutTrailers)), floorcall.TimeoutMs, &callID)
	} else {
		st = proxyGRPCCall(unsafe.Pointer(&calloutService[0]), uint32(len(calloutService)), floorcall.Service, floorcall.Method,
			unsafe.Pointer(&calloutMetadata[0]), uint32(len(calloutMetadata)),
			unsafe.Pointer(&calloutBody[0]), uint32(len(calloutBody)), floorcall.TimeoutMs, &callID)
	}
	if st != 0 {
		return 0
	}
	calls[callID] = id
	return 1
}

// answered resumes the stream of call token; size is the body's or the
// message's size, if read.
func answered(token, size uint32) {
	id, ok := calls[token]
	if !ok {
		return
	}
	delete(calls, token)
	if readAnswer && size > 0 {
		var d, n uint32
		if callout == calloutHTTP {
			proxyGetHeaderMapValue(6, ":status", &d, &n)     // HTTP call response headers
			proxyGetHeaderMapValue(7, "grpc-status", &d, &n) // and trailers
			proxyGetBufferBytes(4, 0, size, &d, &n)          // HTTP call response body
		} else {
			proxyGetBufferBytes(5, 0, size, &d, &n) // gRPC receive buffer
		}
	}
	if proxySetEffectiveContext(id) == 0 {
		proxyContinueStream(0)
	}
}

//go:wasmexport proxy_on_http_call_response
func proxyOnHTTPCallResponse(rootID, token, numHeaders, bodySize, numTrailers uint32) {
	answered(token, bodySize)
}

//go:wasmexport proxy_on_grpc_receive
func proxyOnGRPCReceive(rootID, token, size uint32) { answered(token, size) }

//go:wasmexport proxy_on_grpc_close
func proxyOnGRPCClose(rootID, token, status uint32) { answered(token, 0) }

//go:wasmimport env proxy_http_call
func proxyHTTPCall(upstream string, headers unsafe.Pointer, headersSize uint32, body unsafe.Pointer, bodySize uint32,
	trailers unsafe.Pointer, trailersSize uint32, timeoutMs uint32, retCallID *uint32) uint32

//go:wasmimport env proxy_grpc_call
func proxyGRPCCall(service unsafe.Pointer, serviceSize uint32, serviceName, methodName string,
	metadata unsafe.Pointer, metadataSize uint32, message unsafe.Pointer, messageSize uint32,
	timeoutMs uint32, retCallID *uint32) uint32

//go:wasmimport env proxy_set_effective_context
func proxySetEffectiveContext(id uint32) uint32

//go:wasmimport env proxy_continue_stream
func proxyContinueStream(stream uint32) uint32
