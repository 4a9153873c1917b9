#!/bin/sh
# wasm-build.sh builds sluice's proxy-wasm filter with upstream Go.
#
#   ./wasm-build.sh [output]     (default: ./build/filter.wasm)
#
# The module is built as a WASI reactor (-buildmode=c-shared): the host calls
# _initialize, then the proxy-wasm callbacks. Envoy >= 1.33 is needed (its
# proxy-wasm host stubs the WASI calls the Go runtime makes).
set -eu

cd "$(dirname "$0")"
out=${1:-build/filter.wasm}
mkdir -p "$(dirname "$out")"

GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -trimpath -ldflags='-s -w' -o "$out" ./filter/proxywasm

size=$(wc -c <"$out" | tr -d ' ')
echo "$out $size bytes"
