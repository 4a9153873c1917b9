package config

import (
	"testing"
	"time"
)

// TestParseDurationMatchesTime checks parseDuration against
// time.ParseDuration, which the filter cannot link.
func TestParseDurationMatchesTime(t *testing.T) {
	for _, s := range []string{
		"0", "20ms", "1s", "1.5s", "0.020s", ".5s", "5.s", "1m30s", "2h45m", "100us", "100µs", "100μs",
		"7ns", "-3s", "+3s", "1.000000001s", "0.1ms", "60s", "1h0m0.5s",
		"", "ms", "1", "1x", "s1", "1..5s", "-", ".s", "1.5.5s", "9223372037s",
	} {
		want, werr := time.ParseDuration(s)
		got, ok := parseDuration(s)
		if ok != (werr == nil) || (ok && got != int64(want)) {
			t.Errorf("parseDuration(%q) = %d, %v; time.ParseDuration = %d, %v", s, got, ok, int64(want), werr)
		}
	}
}
