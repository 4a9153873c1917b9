package rlqs

import (
	"math"
	"testing"
)

var inf = math.Inf(1)

func TestShares(t *testing.T) {
	tests := []struct {
		name    string
		rate    float64
		demands []float64
		want    []float64
	}{
		{"none", 100, nil, []float64{}},
		{"one below", 100, []float64{30}, []float64{30}},
		{"one above", 100, []float64{300}, []float64{100}},
		{"equal above", 90, []float64{100, 100, 100}, []float64{30, 30, 30}},
		{"1:4:10 at 3x", 100, []float64{20, 80, 200}, []float64{20, 40, 40}},
		{"order kept", 100, []float64{200, 20, 80}, []float64{40, 20, 40}},
		{"all below", 100, []float64{10, 20, 30}, []float64{10, 20, 30}},
		{"two small", 100, []float64{10, 10, 500, 500}, []float64{10, 10, 40, 40}},
		{"cascade", 100, []float64{30, 34, 1000}, []float64{30, 34, 36}},
		{"unknown takes a split", 100, []float64{inf, 10}, []float64{90, 10}},
		{"all unknown", 90, []float64{inf, inf, inf}, []float64{30, 30, 30}},
		{"negative and NaN are 0", 100, []float64{-5, math.NaN(), 500}, []float64{0, 0, 100}},
		{"zero rate", 0, []float64{10, 20}, []float64{0, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Shares(tt.rate, tt.demands)
			if len(got) != len(tt.want) {
				t.Fatalf("Shares(%v, %v) = %v, want %v", tt.rate, tt.demands, got, tt.want)
			}
			sum := 0.0
			for i := range got {
				sum += got[i]
				if math.Abs(got[i]-tt.want[i]) > 1e-9 {
					t.Errorf("Shares(%v, %v) = %v, want %v", tt.rate, tt.demands, got, tt.want)
					break
				}
			}
			if sum > tt.rate+1e-9 {
				t.Errorf("shares sum to %v, more than the rate %v", sum, tt.rate)
			}
		})
	}
}

// TestSharesNeverExceed checks the invariant over many demand vectors: the
// shares sum to at most the rate, and to the rate when demand exceeds it;
// no Envoy gets more than its demand.
func TestSharesNeverExceed(t *testing.T) {
	for n := 1; n <= 7; n++ {
		for seed := range 200 {
			demands := make([]float64, n)
			total := 0.0
			for i := range demands {
				demands[i] = float64((seed*7919+i*104729)%1000) / 3
				total += demands[i]
			}
			shares := Shares(100, demands)
			sum := 0.0
			for i, s := range shares {
				if s > demands[i]+1e-9 {
					t.Fatalf("Shares(100, %v): share %d = %v exceeds its demand", demands, i, s)
				}
				sum += s
			}
			if sum > 100+1e-9 || (total >= 100 && sum < 100-1e-9) || (total < 100 && math.Abs(sum-total) > 1e-9) {
				t.Fatalf("Shares(100, %v) = %v sums to %v", demands, shares, sum)
			}
		}
	}
}

func TestWant(t *testing.T) {
	tests := []struct {
		demand, headroom, floor, want float64
	}{
		{20, 0.05, 1, 22},
		{0, 0.05, 1, 1},
		{-3, 0.05, 1, 1},
		{100, 0, 0, 100},
		{inf, 0.05, 1, inf},
		{math.NaN(), 0.05, 1, inf},
	}
	for _, tt := range tests {
		if got := Want(tt.demand, tt.headroom, tt.floor); got != tt.want {
			t.Errorf("Want(%v, %v, %v) = %v, want %v", tt.demand, tt.headroom, tt.floor, got, tt.want)
		}
	}
}

func TestAllot(t *testing.T) {
	tests := []struct {
		name  string
		all   map[string]Envoy
		envoy string
		want  float64
	}{
		{"alone, unknown", map[string]Envoy{"a": {inf, 0}}, "a", 100},
		{"alone, small", map[string]Envoy{"a": {20, 100}}, "a", 20},
		{"newcomer while the rate is held", map[string]Envoy{"a": {inf, 100}, "b": {inf, 0}}, "b", 0},
		{"shrinks to its fair share", map[string]Envoy{"a": {200, 100}, "b": {inf, 0}}, "a", 50},
		{"grows into what is free", map[string]Envoy{"a": {200, 50}, "b": {200, 0}}, "b", 50},
		{"grows only as far as free", map[string]Envoy{"a": {200, 70}, "b": {200, 0}}, "b", 30},
		{"small below fair share", map[string]Envoy{"a": {20, 0}, "b": {80, 0}, "c": {200, 0}}, "a", 20},
		{"1:4:10 at 3x", map[string]Envoy{"a": {20, 20}, "b": {80, 0}, "c": {200, 40}}, "b", 40},
		{"unknown Envoy", map[string]Envoy{"a": {20, 20}}, "z", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Allot(100, tt.all, tt.envoy, 0, 0); math.Abs(got-tt.want) > 1e-9 {
				t.Errorf("Allot(100, %v, %q) = %v, want %v", tt.all, tt.envoy, got, tt.want)
			}
		})
	}
}
