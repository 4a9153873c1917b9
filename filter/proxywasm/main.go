//go:build wasip1

// Command proxywasm is filter.wasm, sluice's proxy-wasm filter (ABI 0.2.1):
// the filter's core (package filter/core) on the proxy-wasm host. Build it
// with ../../wasm-build.sh:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -ldflags='-s -w' -o filter.wasm ./filter/proxywasm
//
// The host must call _initialize before any callback (Envoy's proxy-wasm
// host does).
package main

import "github.com/sluicehq/sluice/filter/proxywasm/abi"

func init() {
	abi.SetHandler(newVM(newProxy()))
}

// main is not called in c-shared mode; the callbacks are the entry points.
func main() {}
