//go:build !wasip1

package main

// A native build of package main only compiles (filter.wasm runs as wasip1):
// the proxy is the interfaces of host.go.
type (
	rootAPI   = rootProxy
	streamAPI = streamProxy
	callAPI   = callProxy
)
