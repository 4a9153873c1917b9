//go:build wasip1

// Command filter is sluice's proxy-wasm filter (ABI 0.2.1). Build it with
// ../wasm-build.sh:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -ldflags='-s -w' -o filter.wasm ./filter
//
// The host must call _initialize before any callback (Envoy's proxy-wasm
// host does).
package main

import (
	"github.com/sluicehq/sluice/filter/plugin"
	"github.com/sluicehq/sluice/filter/proxywasm/abi"
)

func init() {
	abi.SetHandler(plugin.NewVM(newHost()))
}

// main is not called in c-shared mode; the callbacks are the entry points.
func main() {}
