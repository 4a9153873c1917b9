package xdsconfig

import (
	"math"
	"testing"
	"time"
)

func TestBackoffDelay(t *testing.T) {
	b := Backoff{Initial: time.Second, Max: 8 * time.Second, RandomFactor: 0.5}
	for _, tc := range []struct {
		attempt int
		rnd     float64
		want    time.Duration
	}{
		{0, 0.5, time.Second},
		{1, 0.5, 2 * time.Second},
		{3, 0.5, 8 * time.Second},
		{10, 0.5, 8 * time.Second},
		{0, 0, 500 * time.Millisecond},
		{3, 0.999999, 12*time.Second - 16*time.Microsecond},
	} {
		if got := b.Delay(tc.attempt, tc.rnd); got.Round(time.Millisecond) != tc.want.Round(time.Millisecond) {
			t.Errorf("Delay(%d, %v) = %v, want %v", tc.attempt, tc.rnd, got, tc.want)
		}
	}
	if got := (Backoff{}).Delay(0, 0.5); got != DefaultBackoffInitial {
		t.Errorf("zero Backoff: %v, want %v", got, DefaultBackoffInitial)
	}
	if got := (Backoff{Initial: time.Second, RandomFactor: 7}).Delay(0, 0); got != 0 {
		t.Errorf("RandomFactor above 1 is capped at 1: %v", got)
	}
	// Values that once gave a retry in -2562047h (a hot reconnect loop):
	// NaN spread, and doubling past the largest duration.
	for _, b := range []Backoff{
		{Initial: time.Second, Max: time.Minute, RandomFactor: math.NaN()},
		{Initial: time.Hour, Max: math.MaxInt64, RandomFactor: 1},
	} {
		for _, attempt := range []int{0, 1, 70, 1000} {
			if got := b.Delay(attempt, 0.999); got < b.Initial/2 {
				t.Errorf("%+v: Delay(%d) = %v, want at least half of Initial", b, attempt, got)
			}
		}
	}
}
