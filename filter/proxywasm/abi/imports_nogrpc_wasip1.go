//go:build wasip1 && sluice_nogrpc

package abi

import "unsafe"

// A build with the sluice_nogrpc tag imports no gRPC host function, for
// hosts without them (proxy-wasm-go-sdk's proxytest, which the conformance
// test runs): transport "grpc" then fails every call with UNIMPLEMENTED,
// and the failure mode decides.

func proxyGRPCCall(service unsafe.Pointer, serviceSize uint32, serviceName, methodName string,
	metadata unsafe.Pointer, metadataSize uint32, message unsafe.Pointer, messageSize uint32,
	timeoutMs uint32, retCallID *uint32) uint32 {
	return uint32(StatusUnimplemented)
}

func proxyGetStatus(retCode, retMessage, retMessageSize *uint32) uint32 {
	return uint32(StatusUnimplemented)
}
