package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const sample = `run lines...
medians of 3 runs:
system           decisions/s    p50_ms    p95_ms    p99_ms server_cpu_us redis_cpu_us     cmd_usec
ratelimit              20179     2.000     5.000     8.060         67.50        11.50        10.00
sluice                107176     0.400     0.900     1.360          7.60         2.90         2.50
sluice / envoyproxy/ratelimit: 5.31x decisions/s (goal >= 4x), p99 1.360 vs 8.060 ms (goal <=)
`

// TestParseAndRender: the medians table becomes one bar per system in
// each panel, with its figures.
func TestParseAndRender(t *testing.T) {
	rows, _, err := parseMedians(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[1] != (row{"sluice", 107176, 7.6, 2.9}) {
		t.Fatalf("rows %+v", rows)
	}
	svg := string(render("lean client", rows))
	for _, w := range []string{">envoyproxy/ratelimit<", ">107,176<", ">20,179<", ">7.6 + 2.9<", ">67.5 + 11.5<", ">lean client<"} {
		if !strings.Contains(svg, w) {
			t.Errorf("the chart lacks %s", w)
		}
	}
	if strings.Count(svg, "<rect") != 1+2+4 {
		t.Errorf("%d rects, want the background, 2 rate bars and 2 stacked CPU bars", strings.Count(svg, "<rect"))
	}
	if _, _, err := parseMedians(strings.NewReader("no table\n")); err == nil {
		t.Error("input without medians accepted")
	}
	if _, _, err := parseMedians(strings.NewReader(strings.Replace(sample, "107176", "-", 1))); err == nil {
		t.Error("a system without decisions/s accepted")
	}
}

// TestDocsCharts: the charts in docs/ are what their transcribed tables
// draw (go generate ./docs after changing one).
func TestDocsCharts(t *testing.T) {
	txts, err := filepath.Glob("../../docs/bench-rls-*.txt")
	if err != nil || len(txts) == 0 {
		t.Fatalf("no docs/bench-rls-*.txt: %v", err)
	}
	for _, txt := range txts {
		f, err := os.Open(txt)
		if err != nil {
			t.Fatal(err)
		}
		want, err := chart(f, "")
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", txt, err)
		}
		got, err := os.ReadFile(strings.TrimSuffix(txt, ".txt") + ".svg")
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s.svg is not what %s draws (%v): run go generate ./docs", strings.TrimSuffix(txt, ".txt"), txt, err)
		}
	}
}
