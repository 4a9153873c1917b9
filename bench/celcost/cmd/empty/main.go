// Command empty is the smallest Wasm reactor module upstream Go builds:
// the floor the other two are compared with.
package main

func main() {}

//lint:ignore U1000 the host calls it (go:wasmexport)
//go:wasmexport cost
func cost(input, output, cached, a, b, c int64) int64 { return input*a + output*b + cached*c }
