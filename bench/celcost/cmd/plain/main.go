// Command plain is a Wasm reactor module that computes the weighted cost
// with filter/core/llm's integer arithmetic.
package main

import "github.com/sluicehq/sluice/filter/core/llm"

func main() {}

//lint:ignore U1000 the host calls it (go:wasmexport)
//go:wasmexport cost
func cost(input, output, cached, a, b, c int64) int64 {
	return llm.Weights{Input: a, Output: b, Cached: c}.Cost(llm.Usage{Input: input, Output: output, Cached: cached})
}
