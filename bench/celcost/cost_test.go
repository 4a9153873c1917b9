package celcost

import (
	"testing"

	"github.com/sluicehq/sluice/filter/llm"
)

var (
	vars = Vars{Input: 1017, Output: 297, Cached: 768, A: 3_000_000, B: 15_000_000, C: 300_000}
	sink int64
)

func TestSame(t *testing.T) {
	prg, err := Compile()
	if err != nil {
		t.Fatal(err)
	}
	got := Eval(prg, &vars)
	w := llm.Weights{Input: vars.A, Output: vars.B, Cached: vars.C}
	want := w.Cost(llm.Usage{Input: vars.Input, Output: vars.Output, Cached: vars.Cached})
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
	w := llm.Weights{Input: vars.A, Output: vars.B, Cached: vars.C}
	u := llm.Usage{Input: vars.Input, Output: vars.Output, Cached: vars.Cached}
	b.ReportAllocs()
	for b.Loop() {
		sink = w.Cost(u)
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
