// Command withcel is a Wasm reactor module that evaluates the weighted cost
// with cel-go: its size, against cmd/plain's, is what cel-go adds.
package main

import "github.com/sluicehq/sluice/bench/celcost"

func main() {}

//lint:ignore U1000 cost reads it
var prg, _ = celcost.Compile()

//lint:ignore U1000 the host calls it (go:wasmexport)
//go:wasmexport cost
func cost(input, output, cached, a, b, c int64) int64 {
	return celcost.Eval(prg, &celcost.Vars{input, output, cached, a, b, c})
}
