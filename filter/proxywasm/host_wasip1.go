//go:build wasip1 && !sluicetest

package main

import "github.com/sluicehq/sluice/filter/proxywasm/abi"

// newProxy returns the proxy the filter talks to.
func newProxy() proxy {
	return proxy{root: abi.NewHost(), stream: abi.Stream{}, calls: abi.CallResponse{}}
}
