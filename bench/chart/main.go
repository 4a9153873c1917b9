// Command chart draws bench-rls's medians as an SVG bar chart: decisions
// per second, and CPU per decision (the system's own and Redis's, stacked)
// for each system. rls-compare.sh runs it when CHART names the file to
// write; it reads the table that follows "medians of N runs:".
//
//	chart -title "lean client, 2026-11-24" -o bench-rls.svg < rls-compare.log
//	chart -i docs/bench-rls-lean.txt -o docs/bench-rls-lean.svg
//
// A value written "-" is unknown (a table transcribed without it). A line
// "title: ..." before the table is the title when -title is not given.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
)

func main() {
	title := flag.String("title", "", "chart title")
	out := flag.String("o", "", "SVG `file` to write")
	in := flag.String("i", "", "input `file` (default: standard input)")
	flag.Parse()
	if *out == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: chart [-title T] [-i rls-compare output] -o out.svg")
		os.Exit(2)
	}
	var r io.Reader = os.Stdin
	if *in != "" {
		f, err := os.Open(*in)
		if err != nil {
			fmt.Fprintln(os.Stderr, "chart:", err)
			os.Exit(1)
		}
		defer f.Close()
		r = f
	}
	svg, err := chart(r, *title)
	if err == nil {
		err = os.WriteFile(*out, svg, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "chart:", err)
		os.Exit(1)
	}
}

// row is one system's medians.
type row struct {
	system              string
	rate                float64 // decisions/s
	serverCPU, redisCPU float64 // us per decision
}

// names are what the chart calls the systems of rls-compare.sh.
var names = map[string]string{
	"ratelimit":      "envoyproxy/ratelimit",
	"sluice":         "sluice",
	"sluice-lease":   "sluice, lease: auto",
	"sluice-grpc-go": "sluice on grpc-go",
	"sluice-base":    "sluice (base)",
	"floor":          "floor (transport only)",
}

// chart reads rls-compare's output from r and draws its medians; title
// "" takes the input's "title: " line.
func chart(r io.Reader, title string) ([]byte, error) {
	rows, inTitle, err := parseMedians(r)
	if err != nil {
		return nil, err
	}
	if title == "" {
		title = inTitle
	}
	return render(title, rows), nil
}

// parseMedians reads the table after "medians of N runs:": the header,
// then one line per system until a line that is not one.
func parseMedians(r io.Reader) (rows []row, title string, err error) {
	sc := bufio.NewScanner(r)
	in := false
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case !in && strings.HasPrefix(sc.Text(), "title: "):
			title = strings.TrimPrefix(sc.Text(), "title: ")
		case !in && strings.HasPrefix(sc.Text(), "medians of "):
			in = true
		case in && len(f) > 0 && f[0] == "system":
		case in && len(f) == 8:
			var v [7]float64
			for i := range v {
				if f[i+1] == "-" {
					v[i] = math.NaN()
					continue
				}
				x, err := strconv.ParseFloat(f[i+1], 64)
				if err != nil {
					return nil, "", fmt.Errorf("medians of %s: %v", f[0], err)
				}
				v[i] = x
			}
			rows = append(rows, row{system: f[0], rate: v[0], serverCPU: v[4], redisCPU: v[5]})
		case in:
			in = len(rows) == 0
		}
	}
	if err := sc.Err(); err != nil {
		return nil, "", err
	}
	if len(rows) == 0 {
		return nil, "", errors.New(`no "medians of N runs:" table in the input`)
	}
	for _, r := range rows {
		if math.IsNaN(r.rate) || math.IsNaN(r.serverCPU) || math.IsNaN(r.redisCPU) {
			return nil, "", fmt.Errorf("medians of %s: decisions/s, server_cpu_us and redis_cpu_us are needed", r.system)
		}
	}
	return rows, title, nil
}

const (
	width   = 760
	labelW  = 190
	barH    = 22
	gap     = 8
	panelGp = 46
)

// render draws two panels of horizontal bars.
func render(title string, rows []row) []byte {
	var b bytes.Buffer
	panelH := len(rows)*(barH+gap) + 30
	height := 40 + 2*panelH + panelGp + 30
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="#ffffff"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="10" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", esc(title))
	maxRate, maxCPU := 0.0, 0.0
	for _, r := range rows {
		maxRate = math.Max(maxRate, r.rate)
		maxCPU = math.Max(maxCPU, r.serverCPU+r.redisCPU)
	}
	plotW := float64(width - labelW - 110)
	y := 40
	fmt.Fprintf(&b, `<text x="10" y="%d" font-weight="bold">decisions per second (higher is better)</text>`+"\n", y+12)
	y += 22
	for _, r := range rows {
		w := plotW * r.rate / maxRate
		bar(&b, r.system, y, []seg{{w, "#4a7fb5"}})
		fmt.Fprintf(&b, `<text x="%.1f" y="%d">%s</text>`+"\n", float64(labelW)+w+6, y+15, thousands(r.rate))
		y += barH + gap
	}
	y += panelGp - 22
	fmt.Fprintf(&b, `<text x="10" y="%d" font-weight="bold">CPU per decision, microseconds (lower is better): <tspan fill="#c0504d">system</tspan> + <tspan fill="#e8a33d">Redis</tspan></text>`+"\n", y+12)
	y += 22
	for _, r := range rows {
		ws := plotW * r.serverCPU / maxCPU
		wr := plotW * r.redisCPU / maxCPU
		bar(&b, r.system, y, []seg{{ws, "#c0504d"}, {wr, "#e8a33d"}})
		fmt.Fprintf(&b, `<text x="%.1f" y="%d">%s + %s</text>`+"\n", float64(labelW)+ws+wr+6, y+15,
			strconv.FormatFloat(r.serverCPU, 'f', -1, 64), strconv.FormatFloat(r.redisCPU, 'f', -1, 64))
		y += barH + gap
	}
	b.WriteString("</svg>\n")
	return b.Bytes()
}

// seg is one part of a stacked bar.
type seg struct {
	w     float64
	color string
}

func bar(b *bytes.Buffer, system string, y int, segs []seg) {
	name := names[system]
	if name == "" {
		name = system
	}
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", labelW-8, y+15, esc(name))
	x := float64(labelW)
	for _, s := range segs {
		fmt.Fprintf(b, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", x, y, s.w, barH, s.color)
		x += s.w
	}
}

// thousands writes n rounded, with thousands separators.
func thousands(n float64) string {
	s := strconv.FormatInt(int64(math.Round(n)), 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func esc(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}
