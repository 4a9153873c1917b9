package svgchart

import (
	"strings"
	"testing"
)

// TestTimeline: one tick per event, on an axis long enough for the last,
// and each row's count.
func TestTimeline(t *testing.T) {
	svg := string(Timeline("a burst", []Series{
		{Name: "reserve", Times: []float64{0, 1, 100, 200, 2950}},
		{Name: "token_bucket", Times: []float64{0, 1}, Note: "3 refused"},
	}))
	for _, w := range []string{">a burst<", ">reserve<", ">5 arrived<", ">2 arrived, 3 refused<", ">3 s<"} {
		if !strings.Contains(svg, w) {
			t.Errorf("the timeline lacks %s", w)
		}
	}
	if n := strings.Count(svg, `stroke-width="2"`); n != 7 {
		t.Errorf("%d ticks, want 7", n)
	}
	if strings.Contains(svg, ">4 s<") {
		t.Error("the axis runs past the last arrival's second")
	}
}
