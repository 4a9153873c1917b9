//go:build wasip1 && !sluice_nogrpc

package abi

import "unsafe"

// The host functions of transport "grpc". Every proxy-wasm host of ABI
// 0.2.1 the filter claims (Envoy) provides them; an emulator that does not
// (proxy-wasm-go-sdk's proxytest) loads a build with the sluice_nogrpc tag
// (imports_nogrpc_wasip1.go) instead.

//go:wasmimport env proxy_grpc_call
func proxyGRPCCall(service unsafe.Pointer, serviceSize uint32, serviceName, methodName string,
	metadata unsafe.Pointer, metadataSize uint32, message unsafe.Pointer, messageSize uint32,
	timeoutMs uint32, retCallID *uint32) uint32

//go:wasmimport env proxy_get_status
func proxyGetStatus(retCode, retMessage, retMessageSize *uint32) uint32
