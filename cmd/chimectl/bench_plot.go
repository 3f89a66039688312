package main

import (
	"fmt"
	"math"
	"strings"
)

// plot draws the per-second timeline of a bench as one SVG: event rates on
// top, fire lateness (p50, p99, max of the events fired in each second, on
// a log scale) below.
func (r *benchRun) plot() string {
	r.mu.Lock()
	n := len(r.secs)
	acked, fired, consumed := make([]float64, n), make([]float64, n), make([]float64, n)
	p50, p99, pmax := make([]float64, n), make([]float64, n), make([]float64, n)
	for i, s := range r.secs {
		acked[i], fired[i], consumed[i] = float64(s.acked), float64(s.fired), float64(s.consumed)
		l := append([]float64(nil), s.late...)
		p50[i], p99[i], pmax[i] = math.NaN(), math.NaN(), math.NaN()
		if len(l) > 0 {
			p50[i], p99[i], pmax[i] = quantile(l, 0.5), quantile(l, 0.99), quantile(l, 1)
		}
	}
	title := fmt.Sprintf("chimectl bench: %d events, %d callers, batch %d", r.o.events, r.o.callers, r.o.batch)
	r.mu.Unlock()

	const w, panelH, left, top, gap = 900, 260, 70, 40, 70
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", w, top+2*panelH+gap+50)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/><text x="%d" y="20" font-size="14">%s</text>`+"\n", left, title)
	xs := func(i int) float64 { return left + float64(i)/float64(max(n-1, 1))*float64(w-left-20) }
	panel := func(y0 int, label string, ys [][]float64, names, colors []string, logY bool) {
		ymax := 1.0
		for _, s := range ys {
			for _, v := range s {
				if !math.IsNaN(v) {
					ymax = math.Max(ymax, v)
				}
			}
		}
		ymin := 0.0
		if logY {
			ymin, ymax = 0, math.Ceil(math.Log10(math.Max(ymax, 1)))
			ymax = math.Max(ymax, 1)
		}
		yv := func(v float64) float64 {
			if logY {
				v = math.Log10(math.Max(v, 1))
			}
			return float64(y0+panelH) - (v-ymin)/(ymax-ymin)*float64(panelH)
		}
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#999"/>`+"\n", left, y0, w-left-20, panelH)
		fmt.Fprintf(&b, `<text x="12" y="%d" transform="rotate(-90 12 %d)" text-anchor="middle">%s</text>`+"\n", y0+panelH/2, y0+panelH/2, label)
		ticks := 4
		if logY {
			ticks = int(ymax) // one per decade: 1, 10, 100 ms...
		}
		for k := 0; k <= ticks; k++ {
			v := ymin + (ymax-ymin)*float64(k)/float64(ticks)
			text := fmt.Sprintf("%.0f", v)
			if logY {
				v = math.Pow(10, v)
				text = fmt.Sprintf("%.0f", v)
			}
			y := yv(v)
			fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#eee"/><text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left, w-20, y, y, left-4, y+4, text)
		}
		for si, s := range ys {
			var pts []string
			for i, v := range s {
				if math.IsNaN(v) {
					if len(pts) > 0 {
						fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`+"\n", colors[si], strings.Join(pts, " "))
						pts = pts[:0]
					}
					continue
				}
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", xs(i), yv(v)))
			}
			if len(pts) > 0 {
				fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`+"\n", colors[si], strings.Join(pts, " "))
			}
			fmt.Fprintf(&b, `<rect x="%d" y="%d" width="10" height="10" fill="%s"/><text x="%d" y="%d">%s</text>`+"\n", left+10+si*130, y0-16, colors[si], left+24+si*130, y0-7, names[si])
		}
	}
	panel(top+10, "events per second", [][]float64{acked, fired, consumed}, []string{"acknowledged", "fired", "consumed"}, []string{"#1f77b4", "#d62728", "#2ca02c"}, false)
	panel(top+10+panelH+gap, "fire lateness, ms (log)", [][]float64{p50, p99, pmax}, []string{"p50", "p99", "max"}, []string{"#2ca02c", "#ff7f0e", "#d62728"}, true)
	for k := 0; k <= 10; k++ {
		i := k * (n - 1) / 10
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%ds</text>`+"\n", xs(i), top+10+2*panelH+gap+16, i)
	}
	b.WriteString("</svg>\n")
	return b.String()
}
