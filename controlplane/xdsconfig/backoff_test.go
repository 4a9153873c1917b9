package xdsconfig

import (
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
}
