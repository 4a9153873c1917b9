package docs

import (
	"bufio"
	"bytes"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// A diagram is boxes on a grid joined by labelled arrows, described in a
// small text format (see architecture.txt):
//
//	box ID COLUMN ROW "Title|line|line"
//	arrow FROM TO "label"
//
// Lines starting with # are comments.
type diagram struct {
	boxes  []box
	byID   map[string]*box
	arrows []arrow
}

type box struct {
	id       string
	col, row int
	lines    []string
}

type arrow struct {
	from, to, label string
}

// Layout of the drawing, in SVG user units.
const (
	boxW, lineH, padY = 250, 18, 14
	gapX, gapY        = 90, 70
	margin            = 20
)

// parseDiagram reads the text description.
func parseDiagram(src []byte) (*diagram, error) {
	d := &diagram{byID: map[string]*box{}}
	sc := bufio.NewScanner(bytes.NewReader(src))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		head, quoted, ok := strings.Cut(line, "\"")
		if !ok || !strings.HasSuffix(quoted, "\"") {
			return nil, fmt.Errorf("line %d: want a quoted text at the end", n)
		}
		text := strings.TrimSuffix(quoted, "\"")
		f := strings.Fields(head)
		switch {
		case len(f) == 4 && f[0] == "box":
			col, err1 := strconv.Atoi(f[2])
			row, err2 := strconv.Atoi(f[3])
			if err1 != nil || err2 != nil || col < 0 || row < 0 {
				return nil, fmt.Errorf("line %d: column and row are whole numbers", n)
			}
			for _, b := range d.boxes {
				if b.id == f[1] {
					return nil, fmt.Errorf("line %d: box %s twice", n, f[1])
				}
			}
			d.boxes = append(d.boxes, box{id: f[1], col: col, row: row, lines: strings.Split(text, "|")})
		case len(f) == 3 && f[0] == "arrow":
			d.arrows = append(d.arrows, arrow{from: f[1], to: f[2], label: text})
		default:
			return nil, fmt.Errorf("line %d: want box ID COLUMN ROW \"text\" or arrow FROM TO \"label\"", n)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	for i := range d.boxes {
		d.byID[d.boxes[i].id] = &d.boxes[i]
	}
	for _, a := range d.arrows {
		if d.byID[a.from] == nil || d.byID[a.to] == nil {
			return nil, fmt.Errorf("arrow %s -> %s: no such box", a.from, a.to)
		}
	}
	return d, nil
}

// rowHeights returns each row's height: its tallest box.
func (d *diagram) rowHeights() []int {
	var h []int
	for _, b := range d.boxes {
		for len(h) <= b.row {
			h = append(h, 0)
		}
		h[b.row] = max(h[b.row], len(b.lines)*lineH+2*padY)
	}
	return h
}

// rect returns a box's top-left corner and size.
func (d *diagram) rect(b *box, heights []int) (x, y, w, h float64) {
	y = margin
	for r := 0; r < b.row; r++ {
		y += float64(heights[r] + gapY)
	}
	x = float64(margin + b.col*(boxW+gapX))
	h = float64(len(b.lines)*lineH + 2*padY)
	y += (float64(heights[b.row]) - h) / 2
	return x, y, boxW, h
}

// Diagram renders the description src as an SVG image.
func Diagram(src []byte) ([]byte, error) {
	d, err := parseDiagram(src)
	if err != nil {
		return nil, err
	}
	heights := d.rowHeights()
	cols := 0
	for _, b := range d.boxes {
		cols = max(cols, b.col+1)
	}
	width := 2*margin + cols*boxW + (cols-1)*gapX
	height := 2*margin - gapY
	for _, h := range heights {
		height += h + gapY
	}
	var w bytes.Buffer
	fmt.Fprintf(&w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" font-size="13">`+"\n", width, height, width, height)
	w.WriteString(`<defs><marker id="head" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="8" markerHeight="8" orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#444"/></marker></defs>` + "\n")
	fmt.Fprintf(&w, `<rect width="%d" height="%d" fill="#ffffff"/>`+"\n", width, height)
	for i := range d.boxes {
		b := &d.boxes[i]
		x, y, bw, bh := d.rect(b, heights)
		fill := "#eef4fb"
		if b.id == "envoy" || b.id == "cp" {
			fill = "#dcebd9"
		}
		fmt.Fprintf(&w, `<rect x="%s" y="%s" width="%s" height="%s" rx="8" fill="%s" stroke="#335"/>`+"\n", num(x), num(y), num(bw), num(bh), fill)
		for j, l := range b.lines {
			weight := ""
			if j == 0 {
				weight = ` font-weight="bold"`
			}
			fmt.Fprintf(&w, `<text x="%s" y="%s" text-anchor="middle"%s>%s</text>`+"\n",
				num(x+bw/2), num(y+padY+float64(j*lineH)+13), weight, escape(l))
		}
	}
	for _, a := range d.arrows {
		fx, fy, fw, fh := d.rect(d.byID[a.from], heights)
		tx, ty, tw, th := d.rect(d.byID[a.to], heights)
		x1, y1 := edge(fx+fw/2, fy+fh/2, fw, fh, tx+tw/2, ty+th/2)
		x2, y2 := edge(tx+tw/2, ty+th/2, tw, th, fx+fw/2, fy+fh/2)
		fmt.Fprintf(&w, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#444" stroke-width="1.5" marker-end="url(#head)"/>`+"\n", num(x1), num(y1), num(x2), num(y2))
		mx, my := (x1+x2)/2, (y1+y2)/2
		anchor, dx, dy := "middle", 0.0, -6.0
		if x1 == x2 { // vertical: the label beside the line
			anchor, dx, dy = "start", 8, 4
		}
		fmt.Fprintf(&w, `<text x="%s" y="%s" text-anchor="%s" font-size="12" fill="#333">%s</text>`+"\n", num(mx+dx), num(my+dy), anchor, escape(a.label))
	}
	w.WriteString("</svg>\n")
	return w.Bytes(), nil
}

// edge returns where the line from the centre (cx, cy) of a w x h box
// towards (tx, ty) leaves the box.
func edge(cx, cy, w, h, tx, ty float64) (float64, float64) {
	dx, dy := tx-cx, ty-cy
	s := math.Inf(1)
	if dx != 0 {
		s = min(s, w/2/math.Abs(dx))
	}
	if dy != 0 {
		s = min(s, h/2/math.Abs(dy))
	}
	return cx + dx*s, cy + dy*s
}

// num formats a coordinate with at most one decimal.
func num(f float64) string { return strconv.FormatFloat(math.Round(f*10)/10, 'f', -1, 64) }

// escape makes s safe as SVG text.
func escape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;").Replace(s)
}
