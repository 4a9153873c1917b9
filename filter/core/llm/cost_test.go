package llm

import (
	"errors"
	"math/big"
	"math/rand/v2"
	"strings"
	"testing"
)

func TestWeightsCost(t *testing.T) {
	dollars := Weights{Input: 3_000_000, Output: 15_000_000, Cached: 300_000, CacheWrite: 3_750_000} // micro-dollars per million tokens
	tokens := Weights{Input: WeightScale, Output: WeightScale, Cached: WeightScale, CacheWrite: WeightScale}
	for _, tc := range []struct {
		name string
		w    Weights
		u    Usage
		want int64
	}{
		{"nothing", dollars, Usage{}, 0},
		// 1000 x 3 + 500 x 15 + 2000 x 0.3 + 100 x 3.75 = 11475 micro-dollars
		{"dollars", dollars, Usage{Input: 1000, Output: 500, Cached: 2000, CacheWrite: 100}, 11475},
		{"tokens", tokens, Usage{Input: 1, Output: 2, Cached: 3, CacheWrite: 4}, 10},
		// 1 token at 0.3 micro-dollars rounds up to 1
		{"rounds up", dollars, Usage{Cached: 1}, 1},
		{"free", Weights{}, Usage{Input: 5, Output: 5}, 0},
		{"saturates", Weights{Output: MaxWeight}, Usage{Output: MaxTokens}, MaxTokens},
		{"saturates at the edge", Weights{Output: WeightScale}, Usage{Output: MaxTokens, Input: 1}, MaxTokens},
		{"negative counts count nothing", dollars, Usage{Input: -5, Output: 1}, 15},
	} {
		if got := tc.w.Cost(tc.u); got != tc.want {
			t.Errorf("%s: Cost = %d, want %d", tc.name, got, tc.want)
		}
	}
}

// TestCostIsExact compares Cost with big-integer arithmetic.
func TestCostIsExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 20000; i++ {
		n := func() int64 { return rng.Int64N(MaxTokens+1) >> rng.IntN(54) }
		w := func() int64 { return rng.Int64N(MaxWeight+1) >> rng.IntN(41) }
		u := Usage{Input: n(), Output: n(), Cached: n(), CacheWrite: n()}
		ws := Weights{Input: w(), Output: w(), Cached: w(), CacheWrite: w()}
		sum := new(big.Int)
		for _, p := range [][2]int64{{u.Input, ws.Input}, {u.Output, ws.Output}, {u.Cached, ws.Cached}, {u.CacheWrite, ws.CacheWrite}} {
			sum.Add(sum, new(big.Int).Mul(big.NewInt(p[0]), big.NewInt(p[1])))
		}
		q, r := new(big.Int).QuoRem(sum, big.NewInt(WeightScale), new(big.Int))
		if r.Sign() != 0 {
			q.Add(q, big.NewInt(1))
		}
		want := int64(MaxTokens)
		if q.Cmp(big.NewInt(MaxTokens)) < 0 {
			want = q.Int64()
		}
		if got := ws.Cost(u); got != want {
			t.Fatalf("%+v x %+v: Cost = %d, want %d", u, ws, got, want)
		}
	}
}

func TestTableLookup(t *testing.T) {
	table, err := NewTable([]Row{
		{Model: "gpt-4o", Input: 1},
		{Model: "gpt-4o*", Input: 2},
		{Model: "gpt-4o-mini*", Input: 3},
		{Model: "claude-sonnet-4-5*", Input: 4, CacheWrite: 40, HasCacheWrite: true},
		{Model: "*", Input: 5},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		model string
		want  Weights
	}{
		{"gpt-4o", Weights{Input: 1, CacheWrite: 1}},                      // exact beats prefix
		{"gpt-4o-2024-08-06", Weights{Input: 2, CacheWrite: 2}},           // prefix
		{"gpt-4o-mini-2024-07-18", Weights{Input: 3, CacheWrite: 3}},      // the longest prefix
		{"claude-sonnet-4-5-20250929", Weights{Input: 4, CacheWrite: 40}}, // cache_write given
		{"llama-3", Weights{Input: 5, CacheWrite: 5}},                     // default
		{"", Weights{Input: 5, CacheWrite: 5}},                            // no model: default
	} {
		if got := table.Weights(tc.model); got != tc.want {
			t.Errorf("Weights(%q) = %+v, want %+v", tc.model, got, tc.want)
		}
	}
	if got := table.Cost("gpt-4o", Usage{Input: WeightScale}); got != 1 {
		t.Errorf("Cost = %d", got)
	}
	if n := testing.AllocsPerRun(100, func() { _ = table.Cost("gpt-4o-mini-2024-07-18", Usage{Input: 5}) }); n != 0 {
		t.Errorf("Cost allocates %v times", n)
	}
}

func TestNewTableErrors(t *testing.T) {
	def := Row{Model: "*", Input: 1}
	for _, tc := range []struct {
		name  string
		rows  []Row
		path  string
		words string
	}{
		{"no rows", nil, "", "default row"},
		{"no default", []Row{{Model: "a"}}, "", "default row"},
		{"empty model", []Row{def, {Model: ""}}, "[1].model", "must not be empty"},
		{"star inside", []Row{def, {Model: "gpt-*-mini"}}, "[1].model", `"*" only as its last`},
		{"long model", []Row{def, {Model: strings.Repeat("m", MaxModelBytes+1)}}, "[1].model", "longer than 256"},
		{"duplicate", []Row{{Model: "a"}, def, {Model: "a"}}, "[2].model", "also row 0"},
		{"two defaults", []Row{def, def}, "[1].model", "also row 0"},
		{"negative input", []Row{def, {Model: "a", Input: -1}}, "[1].input", "between 0 and 1000000000000"},
		{"output too large", []Row{def, {Model: "a", Output: MaxWeight + 1}}, "[1].output", "not 1000000000001"},
		{"negative cached", []Row{def, {Model: "a", Cached: -2}}, "[1].cached", "between"},
		{"negative cache_write", []Row{def, {Model: "a", CacheWrite: -3, HasCacheWrite: true}}, "[1].cache_write", "between"},
		{"too many rows", make([]Row, MaxRows+1), "", "more than 1024"},
	} {
		_, err := NewTable(tc.rows)
		var te *TableError
		if !errors.As(err, &te) {
			t.Errorf("%s: error %v, want a *TableError", tc.name, err)
			continue
		}
		if te.Path() != tc.path || !strings.Contains(err.Error(), tc.words) {
			t.Errorf("%s: %q at %q; want %q at %q", tc.name, err, te.Path(), tc.words, tc.path)
		}
	}
}
