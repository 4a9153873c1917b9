package celcost

import (
	"testing"

	"github.com/sluicehq/sluice/filter/core/llm"
)

var (
	vars = Vars{1017, 297, 768, 3_000_000, 15_000_000, 300_000} // input, output, cached and their weights
	sink int64

	weights = llm.Weights{Input: vars[3], Output: vars[4], Cached: vars[5]}
	usage   = llm.Usage{Input: vars[0], Output: vars[1], Cached: vars[2]}
)

func TestSame(t *testing.T) {
	prg, err := Compile()
	if err != nil {
		t.Fatal(err)
	}
	got := Eval(prg, &vars)
	want := weights.Cost(usage)
	if (got+llm.WeightScale-1)/llm.WeightScale != want { // the expression does not divide by the scale
		t.Errorf("CEL %d, Go %d", got, want)
	}
}

func BenchmarkCEL(b *testing.B) {
	prg, err := Compile()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		sink = Eval(prg, &vars)
	}
}

func BenchmarkGo(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		sink = weights.Cost(usage)
	}
}

// BenchmarkCELCompile is the configuration-time cost per expression.
func BenchmarkCELCompile(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Compile(); err != nil {
			b.Fatal(err)
		}
	}
}
