package stack

import (
	"regexp"
	"slices"
	"strconv"
)

// gctraceLine is a GODEBUG=gctrace=1 line: its wall-clock phases, "a+b+c
// ms clock", of which a and c stop the world (sweep termination, mark
// termination).
var gctraceLine = regexp.MustCompile(`gc \d+ @[\d.]+s \d+%: ([\d.]+)\+[\d.]+\+([\d.]+) ms clock`)

// GCTracePauses returns the GC cycles that gctrace lines in log report
// (a Go dynamic module's runtime writes them to Envoy's stderr, its log,
// with GODEBUG=gctrace=1 in Envoy's environment), and the p99
// and max of their stop-the-world pauses, in microseconds.
func GCTracePauses(log string) (cycles int, p99, maxPause float64) {
	var pauses []float64
	for _, m := range gctraceLine.FindAllStringSubmatch(log, -1) {
		a, _ := strconv.ParseFloat(m[1], 64)
		c, _ := strconv.ParseFloat(m[2], 64)
		pauses = append(pauses, a*1000, c*1000)
		cycles++
	}
	if len(pauses) == 0 {
		return 0, 0, 0
	}
	slices.Sort(pauses)
	return cycles, pauses[min(len(pauses)-1, len(pauses)*99/100)], pauses[len(pauses)-1]
}
