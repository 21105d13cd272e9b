package main

import (
	"fmt"
	"html"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// A minimal SVG line-plot writer for the cost curves: one file per axis
// (curve-backlog.svg, curve-payload.svg, curve-procs.svg), each a 2×2 grid of
// panels (drain rate, worker RSS, WAL per effect, PostgreSQL CPU per effect)
// with one line per system, the x values evenly spaced and labelled, the y
// axis from zero.

const (
	panelW, panelH           = 460, 300
	marginL, marginR         = 70, 20
	marginT, marginB         = 34, 46
	headerH, legendH, footer = 80, 30, 10
)

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2"}

// drawCurves writes one SVG per axis of f into dir.
func drawCurves(f *curvesFile, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	panels := curveFigures[:4]
	for _, ax := range curveAxes {
		var b strings.Builder
		width, height := 2*panelW, headerH+legendH+2*panelH+footer
		fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
			width, height, width, height)
		fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
		sizes := curveSizes(f, ax.name, ax.x)
		text(&b, 12, 22, 16, "start", "bold", "Cost against "+ax.xlabel)
		text(&b, 12, 40, 11, "start", "", "points: "+sizes+" · median of "+strconv.Itoa(rounds(f))+" round(s)")
		text(&b, 12, 55, 11, "start", "", f.caption())
		text(&b, 12, 70, 11, "start", "", "Server: "+serverSettings(f.Settings)+". Compare the systems at one point; single points vary from run to run.")
		// Legend.
		x := 12.0
		for i, s := range f.Systems {
			c := palette[i%len(palette)]
			y := float64(headerH + 14)
			fmt.Fprintf(&b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="%s" stroke-width="2.5"/>`+"\n", x, y-4, x+24, y-4, c)
			text(&b, x+30, y, 12, "start", "", s)
			x += 40 + 7.5*float64(len([]rune(s)))
		}
		for i, fig := range panels {
			xs, series := curveSeries(f, ax.name, ax.x, fig.key)
			ox := float64((i % 2) * panelW)
			oy := float64(headerH + legendH + (i/2)*panelH)
			panel(&b, ox, oy, fig.label, ax.xlabel, ax.name == "payload", xs, f.Systems, series)
		}
		b.WriteString("</svg>\n")
		if err := os.WriteFile(filepath.Join(dir, "curve-"+ax.name+".svg"), []byte(b.String()), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// curveSizes describes the fixed sizes of an axis's points.
func curveSizes(f *curvesFile, axis string, x func(curvePoint) int) string {
	var xs []string
	seen := map[int]bool{}
	var other curvePoint
	for _, p := range f.Points {
		if p.Axis == axis && !seen[x(p)] {
			seen[x(p)] = true
			xs = append(xs, fmtNum(float64(x(p)), 0))
			other = p
		}
	}
	fixed := ""
	switch axis {
	case "backlog":
		fixed = fmt.Sprintf("%d-byte payloads, 1 worker process", other.PayloadBytes)
	case "payload":
		fixed = fmt.Sprintf("%s effects, 1 worker process", fmtNum(float64(other.Backlog), 0))
	case "procs":
		fixed = fmt.Sprintf("%s effects of %d bytes", fmtNum(float64(other.Backlog), 0), other.PayloadBytes)
	}
	return strings.Join(xs, " / ") + "; " + fixed
}

func rounds(f *curvesFile) int {
	r := 0
	for _, p := range f.Points {
		r = max(r, p.Round)
	}
	return r
}

func text(b *strings.Builder, x, y float64, size int, anchor, weight, s string) {
	w := ""
	if weight != "" {
		w = ` font-weight="` + weight + `"`
	}
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" font-size="%d" text-anchor="%s"%s>%s</text>`+"\n", x, y, size, anchor, w, html.EscapeString(s))
}

// panel draws one plot with its origin at (ox, oy).
func panel(b *strings.Builder, ox, oy float64, title, xlabel string, bytes bool, xs []int, systems []string, series map[string][]float64) {
	pw, ph := float64(panelW-marginL-marginR), float64(panelH-marginT-marginB)
	px, py := ox+marginL, oy+marginT
	text(b, ox+marginL, oy+20, 13, "start", "bold", title)
	ymax := 0.0
	for _, ys := range series {
		for _, y := range ys {
			if !math.IsNaN(y) && !math.IsInf(y, 0) {
				ymax = max(ymax, y)
			}
		}
	}
	step := niceStep(ymax)
	top := step * math.Ceil(ymax/step)
	if top == 0 {
		top = 1
	}
	// Grid and y ticks.
	for v := 0.0; v <= top+step/2; v += step {
		y := py + ph - v/top*ph
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", px, y, px+pw, y)
		text(b, px-6, y+4, 11, "end", "", shortNum(v))
	}
	// Axes.
	fmt.Fprintf(b, `<polyline points="%.1f,%.1f %.1f,%.1f %.1f,%.1f" fill="none" stroke="#333"/>`+"\n", px, py, px, py+ph, px+pw, py+ph)
	xpos := func(i int) float64 {
		if len(xs) == 1 {
			return px + pw/2
		}
		return px + 20 + float64(i)*(pw-40)/float64(len(xs)-1)
	}
	for i, x := range xs {
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333"/>`+"\n", xpos(i), py+ph, xpos(i), py+ph+4)
		label := shortNum(float64(x))
		if bytes {
			label = byteSize(x)
		}
		text(b, xpos(i), py+ph+17, 11, "middle", "", label)
	}
	text(b, px+pw/2, py+ph+36, 11, "middle", "", xlabel)
	for si, s := range systems {
		c := palette[si%len(palette)]
		var pts []string
		for i, y := range series[s] {
			if math.IsNaN(y) || math.IsInf(y, 0) {
				continue
			}
			cx, cy := xpos(i), py+ph-y/top*ph
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", cx, cy))
			fmt.Fprintf(b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"><title>%s: %s</title></circle>`+"\n", cx, cy, c, html.EscapeString(s), fmtNum(y, 1))
		}
		if len(pts) > 1 {
			fmt.Fprintf(b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", strings.Join(pts, " "), c)
		}
	}
}

// niceStep is a 1, 2 or 5 × 10^k step giving about five grid lines to max.
func niceStep(max float64) float64 {
	if max <= 0 || math.IsNaN(max) {
		return 1
	}
	raw := max / 5
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if raw <= m*p {
			return m * p
		}
	}
	return 10 * p
}

// shortNum formats 1500 as 1.5k, 2000000 as 2M.
func shortNum(v float64) string {
	a := math.Abs(v)
	trim := func(s string) string {
		if strings.Contains(s, ".") {
			s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
		}
		return s
	}
	switch {
	case a >= 1e6:
		return trim(fmt.Sprintf("%.2f", v/1e6)) + "M"
	case a >= 1e3:
		return trim(fmt.Sprintf("%.2f", v/1e3)) + "k"
	case a >= 10 || a == 0:
		return fmt.Sprintf("%.0f", v)
	default:
		return trim(fmt.Sprintf("%.2f", v))
	}
}

// byteSize formats 4096 as "4 KiB" and 300 as "300 B".
func byteSize(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

// serverSettings is settings (name=value …) without
// shared_preload_libraries, which does not change the figures.
func serverSettings(settings string) string {
	var out []string
	for _, f := range strings.Fields(settings) {
		if !strings.HasPrefix(f, "shared_preload_libraries=") {
			out = append(out, f)
		}
	}
	return strings.Join(out, " ")
}
