//go:build !wasip1

// Command proxywasm is filter.wasm, sluice's proxy-wasm filter. It only runs
// as filter.wasm, built for GOOS=wasip1 GOARCH=wasm with -buildmode=c-shared
// (see ../../wasm-build.sh); this native build only says so.
package main

import "os"

func main() {
	os.Stderr.WriteString("filter: build with GOOS=wasip1 GOARCH=wasm -buildmode=c-shared (see wasm-build.sh)\n")
	os.Exit(2)
}
