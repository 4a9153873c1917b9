#!/bin/sh
# sizes.sh: the size of a Wasm reactor module (built as the filter is) that
# evaluates the weighted cost with cel-go, with filter/core/llm, and with nothing.
set -eu
cd "$(dirname "$0")"
out=${TMPDIR:-/tmp}/celcost
mkdir -p "$out"
for m in empty plain withcel; do
	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -trimpath -ldflags='-s -w' -o "$out/$m.wasm" ./cmd/$m
	raw=$(wc -c <"$out/$m.wasm" | tr -d ' ')
	gz=$(gzip -9c "$out/$m.wasm" | wc -c | tr -d ' ')
	echo "$m: $raw bytes, $gz gzipped"
done
