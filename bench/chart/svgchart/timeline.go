// Package svgchart draws the benchmark charts of docs/performance.md as
// SVG: arrival timelines (shaping) here; bench/chart draws bench-rls's bars.
package svgchart

import (
	"bytes"
	"fmt"
	"math"
	"strings"
)

// Series is one row of a timeline: events at times in milliseconds.
type Series struct {
	Name  string    // the row's label
	Times []float64 // ms from the start
	Note  string    // printed at the end of the row, e.g. "45 refused"
}

// Timeline draws each series as a row of ticks on one time axis from 0 to
// the latest event (rounded up to a second), with gridlines every second.
func Timeline(title string, series []Series) []byte {
	const (
		width, labelW, rowH, top = 860, 200, 46, 48
	)
	end := 1000.0
	for _, s := range series {
		for _, t := range s.Times {
			end = math.Max(end, math.Ceil(t/1000)*1000)
		}
	}
	plotW := float64(width - labelW - 130)
	x := func(ms float64) float64 { return float64(labelW) + plotW*ms/end }
	height := top + len(series)*rowH + 40
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="#ffffff"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="10" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", esc(title))
	axisY := top + len(series)*rowH
	for s := 0.0; s <= end; s += 1000 {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", x(s), top-6, x(s), axisY)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%g s</text>`+"\n", x(s), axisY+16, s/1000)
	}
	colors := []string{"#4a7fb5", "#c0504d", "#6a9a48", "#e8a33d"}
	for i, s := range series {
		y := top + i*rowH
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", labelW-10, y+rowH/2+4, esc(s.Name))
		for _, t := range s.Times {
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s" stroke-width="2"/>`+"\n",
				x(t), y+8, x(t), y+rowH-8, colors[i%len(colors)])
		}
		note := fmt.Sprintf("%d arrived", len(s.Times))
		if s.Note != "" {
			note += ", " + s.Note
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%d">%s</text>`+"\n", x(end)+10, y+rowH/2+4, esc(note))
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#555">time of arrival at the upstream after the burst was sent</text>`+"\n", labelW, axisY+34)
	b.WriteString("</svg>\n")
	return b.Bytes()
}

func esc(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}
