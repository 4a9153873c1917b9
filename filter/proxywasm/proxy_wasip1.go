//go:build wasip1 && !sluicetest

package main

import "github.com/sluicehq/sluice/filter/proxywasm/abi"

// The proxy of filter.wasm: package abi's bindings.
type (
	rootAPI   = *abi.Host
	streamAPI = abi.Stream
	callAPI   = abi.CallResponse
)

// newProxy returns the proxy the filter talks to.
func newProxy() proxy {
	return proxy{root: abi.NewHost(), stream: abi.Stream{}, calls: abi.CallResponse{}}
}

var (
	_ rootProxy   = (*abi.Host)(nil)
	_ streamProxy = abi.Stream{}
	_ callProxy   = abi.CallResponse{}
)
