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

// TestGrant: an Envoy takes what is free up to its want, and borrows up
// to its fair share what it cannot take, within lendable.
func TestGrant(t *testing.T) {
	tests := []struct {
		name        string
		all         map[string]Envoy
		envoy       string
		lendable    float64
		share, lent float64
	}{
		{"alone, unknown", map[string]Envoy{"a": {inf, 0}}, "a", 100, 100, 0},
		{"alone, small: its demand and headroom", map[string]Envoy{"a": {20, 100}}, "a", 100, 22, 0},
		{"newcomer while the rate is held: its fair share, lent", map[string]Envoy{"a": {inf, 100}, "b": {inf, 0}}, "b", 1000, 50, 50},
		{"newcomer, nothing to lend", map[string]Envoy{"a": {inf, 100}, "b": {inf, 0}}, "b", 0, 0, 0},
		{"newcomer, a loan cut to what the budget lends", map[string]Envoy{"a": {inf, 100}, "b": {inf, 0}}, "b", 20, 20, 20},
		{"shrinks to what is free", map[string]Envoy{"a": {200, 100}, "b": {inf, 50}}, "a", 0, 50, 0},
		{"takes what a departed Envoy left, past its fair share", map[string]Envoy{"a": {200, 25}, "b": {200, 25}, "c": {200, 0}}, "c", 100, 50, 0},
		{"takes what is free up to its want", map[string]Envoy{"a": {200, 20}, "b": {30, 10}}, "b", 100, 32.5, 0},
		{"small below fair share", map[string]Envoy{"a": {20, 0}, "b": {80, 0}, "c": {200, 0}}, "a", 100, 22, 0},
		{"1:4:10 at 3x", map[string]Envoy{"a": {20, 20}, "b": {80, 0}, "c": {200, 40}}, "b", 0, 40, 0},
		{"below its fair share after another took the rest", map[string]Envoy{"a": {200, 60}, "b": {200, 30}}, "b", 100, 50, 10},
		{"unknown Envoy", map[string]Envoy{"a": {20, 20}}, "z", 100, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			share, lent := Grant(100, tt.all, tt.envoy, 0.05, 1, tt.lendable)
			if math.Abs(share-tt.share) > 1e-9 || math.Abs(lent-tt.lent) > 1e-9 {
				t.Errorf("Grant(100, %v, %q, lendable %v) = %v, %v lent; want %v, %v lent", tt.all, tt.envoy, tt.lendable, share, lent, tt.share, tt.lent)
			}
		})
	}
}
