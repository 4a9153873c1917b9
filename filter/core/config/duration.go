package config

import "math"

// Duration units, in nanoseconds.
const (
	Nanosecond  int64 = 1
	Microsecond       = 1000 * Nanosecond
	Millisecond       = 1000 * Microsecond
	Second            = 1000 * Millisecond
	Minute            = 60 * Second
	Hour              = 60 * Minute
)

// parseDuration parses a duration as Go's time.ParseDuration does ("20ms",
// "1.5s", "1m30s"; units ns, us, µs, ms, s, m, h) into nanoseconds. The
// filter does not link package time: it brings in WASI imports
// (fd_fdstat_set_flags, ...) that proxies need not provide.
func parseDuration(s string) (int64, bool) {
	neg := false
	if s != "" && (s[0] == '-' || s[0] == '+') {
		neg = s[0] == '-'
		s = s[1:]
	}
	if s == "0" {
		return 0, true
	}
	if s == "" {
		return 0, false
	}
	var total float64
	for s != "" {
		// The number: digits, optionally a fraction.
		i := 0
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		intPart := s[:i]
		s = s[i:]
		frac := ""
		if s != "" && s[0] == '.' {
			s = s[1:]
			j := 0
			for j < len(s) && s[j] >= '0' && s[j] <= '9' {
				j++
			}
			frac = s[:j]
			s = s[j:]
		}
		if intPart == "" && frac == "" {
			return 0, false
		}
		// The unit.
		j := 0
		for j < len(s) && s[j] != '.' && (s[j] < '0' || s[j] > '9') {
			j++
		}
		var unit int64
		switch s[:j] {
		case "ns":
			unit = Nanosecond
		case "us", "µs", "μs":
			unit = Microsecond
		case "ms":
			unit = Millisecond
		case "s":
			unit = Second
		case "m":
			unit = Minute
		case "h":
			unit = Hour
		default:
			return 0, false
		}
		s = s[j:]
		v := 0.0
		for _, c := range intPart {
			v = v*10 + float64(c-'0')
		}
		scale := 1.0
		for _, c := range frac {
			scale /= 10
			v += float64(c-'0') * scale
		}
		total += v * float64(unit)
		if total > math.MaxInt64 {
			return 0, false
		}
	}
	n := int64(math.Round(total))
	if neg {
		n = -n
	}
	return n, true
}
