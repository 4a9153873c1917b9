// Command genarch draws docs/architecture.svg from its text description:
// go generate ./docs.
//
//	genarch architecture.txt architecture.svg
package main

import (
	"fmt"
	"os"

	"github.com/sluicehq/sluice/docs"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: genarch DESCRIPTION.txt OUT.svg")
		os.Exit(2)
	}
	src, err := os.ReadFile(os.Args[1])
	if err == nil {
		var svg []byte
		if svg, err = docs.Diagram(src); err == nil {
			err = os.WriteFile(os.Args[2], svg, 0o644)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "genarch:", err)
		os.Exit(1)
	}
}
