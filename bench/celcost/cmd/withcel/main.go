// Command withcel is a Wasm reactor module that evaluates the weighted cost
// with cel-go: its size, against cmd/plain's, is what cel-go adds.
package main

import "github.com/sluicehq/sluice/bench/celcost"

func main() {}

var prg, _ = celcost.Compile()

//go:wasmexport cost
func cost(input, output, cached, a, b, c int64) int64 {
	return celcost.Eval(prg, &celcost.Vars{Input: input, Output: output, Cached: cached, A: a, B: b, C: c})
}
