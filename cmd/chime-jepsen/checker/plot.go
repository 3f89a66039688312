package checker

import (
	"cmp"
	"fmt"
	"html"
	"math"
	"slices"
	"strings"
)

// MaxPlotPoints bounds the dots drawn per plot, so that report.html stays light with
// millions of records.
const MaxPlotPoints = 20000

// Plot geometry, in SVG user units.
const (
	plotWidth   = 960
	plotHeight  = 320 // the axes area
	plotLeft    = 64
	plotRight   = 16
	plotTop     = 24
	plotBottom  = 44 // room for the x axis labels
	legendRowH  = 18
	legendItemW = 190
)

type point struct{ x, y float64 }

// series is one class of dots. Drawing order is the order in plotSpec.series: later series
// are drawn on top.
type series struct {
	name   string
	color  string
	radius float64 // of a dot; half the width of a line
	pts    []point
	// line joins the points in x order instead of drawing dots; a NaN y
	// breaks it. Lines are drawn whole, never downsampled.
	line bool
}

type plotSpec struct {
	id, title, xLabel, yLabel string
	series                    []series
	windows                   []window // driver-clock ns; drawn as bands
	startNs                   int64
	kindColor                 map[string]string
	// annotateMax writes the largest y next to its dot: with the symlog axis the outliers
	// stay on the plot and are named rather than clipped.
	annotateMax bool
	// linearY draws y on a linear axis from 0 (rates) instead of symlog (milliseconds).
	linearY bool
}

// Point, Series and Plot are the plotter for other commands' timelines
// (chimectl bench): the same SVG as the report's plots, without fault bands.
type Point struct{ X, Y float64 }

// Series is one named class of points, drawn as dots, or as a line joining
// them in X order (a NaN Y breaks the line).
type Series struct {
	Name, Color string
	Points      []Point
	Line        bool
}

// Plot is one plot: Y over X (seconds), symlog Y unless LinearY.
type Plot struct {
	ID, Title, XLabel, YLabel string
	Series                    []Series
	LinearY                   bool
}

// StackSVG draws plots one under the other as a standalone SVG document.
func StackSVG(plots ...Plot) string {
	var body strings.Builder
	y := 0
	for _, p := range plots {
		spec := plotSpec{id: p.ID, title: p.Title, xLabel: p.XLabel, yLabel: p.YLabel, linearY: p.LinearY}
		for _, s := range p.Series {
			ss := series{name: s.Name, color: s.Color, radius: 1.5, line: s.Line, pts: make([]point, len(s.Points))}
			for i, pt := range s.Points {
				ss.pts[i] = point{pt.X, pt.Y}
			}
			spec.series = append(spec.series, ss)
		}
		fmt.Fprintf(&body, "<g transform=\"translate(0 %d)\">\n", y)
		y += renderPlot(&body, spec)
		body.WriteString("</g>\n")
	}
	return fmt.Sprintf("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n%s</svg>\n",
		plotWidth, y, body.String())
}

// faultPalette colours nemesis kinds, assigned in sorted kind order so both plots agree.
var faultPalette = []string{"#e41a1c", "#377eb8", "#4daf4a", "#984ea3", "#ff7f00", "#a6761d", "#f781bf", "#999999", "#66c2a5", "#e7298a"}

func kindColors(ws []window) (map[string]string, []string) {
	var kinds []string
	for _, w := range ws {
		if !slices.Contains(kinds, w.kind) {
			kinds = append(kinds, w.kind)
		}
	}
	slices.Sort(kinds)
	m := make(map[string]string, len(kinds))
	for i, k := range kinds {
		m[k] = faultPalette[i%len(faultPalette)]
	}
	return m, kinds
}

// symlog maps milliseconds to a log-ish axis that keeps sign and zero: sign(y)·log10(1+|y|).
// Between -1 and 1 ms it is nearly linear; beyond, each decade gets the same height.
func symlog(y float64) float64 {
	if y < 0 {
		return -math.Log10(1 - y)
	}
	return math.Log10(1 + y)
}

// downsample keeps at most budget points over all series. Dots landing on the same pixel of
// the same series are drawn once (that loses nothing visible); if that is still too many,
// smaller series are kept whole first (they are the rare classes: duplicates, early, failures)
// and the remaining budget is spread evenly in time over the larger ones.
func downsample(ss []series, px func(point) (float64, float64), budget int) []series {
	out := make([]series, len(ss))
	for i, s := range ss {
		if s.line {
			out[i] = s
			continue
		}
		pts := slices.Clone(s.pts)
		slices.SortStableFunc(pts, func(a, b point) int { return cmp.Compare(a.x, b.x) })
		seen := make(map[[2]int32]bool, len(pts))
		kept := pts[:0]
		for _, p := range pts {
			x, y := px(p)
			cell := [2]int32{int32(math.Round(x)), int32(math.Round(y))}
			if !seen[cell] {
				seen[cell] = true
				kept = append(kept, p)
			}
		}
		out[i] = s
		out[i].pts = kept
	}
	total := 0
	for _, s := range out {
		if !s.line {
			total += len(s.pts)
		}
	}
	if total <= budget {
		return out
	}
	order := make([]int, len(out))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(len(out[a].pts), len(out[b].pts)) })
	left := budget
	for n, i := range order {
		share := left / (len(order) - n)
		if pts := out[i].pts; len(pts) > share && !out[i].line {
			sampled := make([]point, share)
			for k := range sampled {
				sampled[k] = pts[k*len(pts)/share]
			}
			out[i].pts = sampled
		}
		left -= len(out[i].pts)
	}
	return out
}

// renderPlot writes one self-contained <svg> element and returns its height.
func renderPlot(b *strings.Builder, p plotSpec) int {
	esc := html.EscapeString
	yScale := symlog
	if p.linearY {
		yScale = func(y float64) float64 { return y }
	}
	// Domain: every dot and every band.
	xmin, xmax := math.Inf(1), math.Inf(-1)
	ymin, ymax := 0.0, 1.0
	for _, s := range p.series {
		for _, pt := range s.pts {
			if math.IsNaN(pt.y) {
				continue
			}
			xmin, xmax = math.Min(xmin, pt.x), math.Max(xmax, pt.x)
			ymin, ymax = math.Min(ymin, pt.y), math.Max(ymax, pt.y)
		}
	}
	for _, w := range p.windows {
		xmin = math.Min(xmin, float64(w.start-p.startNs)/1e9)
		xmax = math.Max(xmax, float64(w.heal-p.startNs)/1e9)
	}
	if math.IsInf(xmin, 1) {
		xmin, xmax = 0, 1
	}
	if xmax-xmin < 1e-9 {
		xmax = xmin + 1
	}
	pad := (xmax - xmin) * 0.01
	xmin, xmax = xmin-pad, xmax+pad
	lo, hi := yScale(ymin), yScale(ymax)
	ypad := (hi - lo) * 0.04
	lo, hi = lo-ypad, hi+ypad

	innerW := float64(plotWidth - plotLeft - plotRight)
	innerH := float64(plotHeight)
	sx := func(x float64) float64 { return plotLeft + (x-xmin)/(xmax-xmin)*innerW }
	sy := func(y float64) float64 { return plotTop + (hi-yScale(y))/(hi-lo)*innerH }
	px := func(pt point) (float64, float64) { return sx(pt.x), sy(pt.y) }

	shown := downsample(p.series, px, MaxPlotPoints)

	kinds := make([]string, 0, len(p.kindColor))
	for k := range p.kindColor {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	legendItems := len(kinds) + len(p.series)
	perRow := max(1, (plotWidth-plotLeft)/legendItemW)
	rows := (legendItems + perRow - 1) / perRow
	height := plotTop + plotHeight + plotBottom + rows*legendRowH + 8

	fmt.Fprintf(b, `<svg id="%s" class="plot" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="%s">`+"\n",
		esc(p.id), plotWidth, height, plotWidth, height, esc(p.title))
	fmt.Fprintf(b, `<rect x="%d" y="%d" width="%.1f" height="%.1f" fill="#fff" stroke="#888"/>`+"\n", plotLeft, plotTop, innerW, innerH)

	// Fault windows as vertical bands, under everything else.
	fmt.Fprintf(b, `<g class="faults">`+"\n")
	for _, w := range p.windows {
		x0 := math.Max(sx(float64(w.start-p.startNs)/1e9), plotLeft)
		x1 := math.Min(sx(float64(w.heal-p.startNs)/1e9), plotLeft+innerW)
		fmt.Fprintf(b, `<rect x="%.1f" y="%d" width="%.1f" height="%.1f" fill="%s" fill-opacity="0.16"><title>%s %s: %.3fs–%.3fs</title></rect>`+"\n",
			x0, plotTop, math.Max(x1-x0, 1), innerH, p.kindColor[w.kind], esc(w.kind), esc(strings.Join(w.targets, ",")),
			float64(w.start-p.startNs)/1e9, float64(w.heal-p.startNs)/1e9)
	}
	fmt.Fprintf(b, "</g>\n")

	// Axes: x ticks at a 1-2-5 step, y ticks at every decade of the symlog axis.
	fmt.Fprintf(b, `<g class="axes" font-size="11" fill="#333">`+"\n")
	step := niceStep((xmax - xmin) / 8)
	for x := math.Ceil(xmin/step) * step; x <= xmax; x += step {
		X := sx(x)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%.1f" stroke="#eee"/>`, X, plotTop, X, plotTop+innerH)
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", X, plotTop+innerH+14, trimFloat(x))
	}
	ticks := yTicks(ymin, ymax)
	if p.linearY {
		ticks = ticks[:0]
		step := niceStep(ymax / 4)
		for t := 0.0; t <= ymax+step/2; t += step {
			ticks = append(ticks, t)
		}
	}
	for _, t := range ticks {
		Y := sy(t)
		if Y < plotTop || Y > plotTop+innerH {
			continue
		}
		stroke := "#eee"
		if t == 0 {
			stroke = "#888"
		}
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`, plotLeft, Y, plotLeft+innerW, Y, stroke)
		fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", plotLeft-4, Y+4, msLabel(t))
	}
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", plotLeft+innerW/2, plotTop+innerH+30, esc(p.xLabel))
	fmt.Fprintf(b, `<text transform="translate(14 %.1f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", plotTop+innerH/2, esc(p.yLabel))
	fmt.Fprintf(b, `<text x="%d" y="16" font-size="13" font-weight="bold">%s</text>`+"\n", plotLeft, esc(p.title))
	fmt.Fprintf(b, "</g>\n")

	// Dots: one path per series, each dot a zero-length round-capped
	// segment; lines: one path per series, a move at each break.
	var maxPt *point
	for i, s := range shown {
		class, cap := "points", "round"
		if s.line {
			class, cap = "line", "butt"
		}
		fmt.Fprintf(b, `<path class="%s" data-series="%s" data-points="%d" data-total="%d" stroke="%s" stroke-width="%.1f" stroke-linecap="%s" fill="none" d="`,
			class, esc(s.name), len(s.pts), len(p.series[i].pts), s.color, 2*s.radius, cap)
		pen := "M"
		for j := range s.pts {
			pt := &s.pts[j]
			if math.IsNaN(pt.y) {
				pen = "M"
				continue
			}
			x, y := px(*pt)
			if s.line {
				fmt.Fprintf(b, "%s%.1f %.1f", pen, x, y)
				pen = "L"
			} else {
				fmt.Fprintf(b, "M%.1f %.1fh0", x, y)
			}
			if maxPt == nil || pt.y > maxPt.y {
				maxPt = pt
			}
		}
		fmt.Fprintf(b, "\"/>\n")
	}
	if p.annotateMax && maxPt != nil {
		x, y := px(*maxPt)
		anchor := "start"
		if x > plotLeft+innerW*0.8 {
			anchor = "end"
		}
		fmt.Fprintf(b, `<text class="outlier" x="%.1f" y="%.1f" font-size="11" text-anchor="%s" fill="#b00">max %s ms</text>`+"\n",
			x+4, math.Max(y-4, plotTop+10), anchor, trimFloat(maxPt.y))
	}

	// Legend: fault kinds, then the dot classes with how many are shown.
	fmt.Fprintf(b, `<g class="legend" font-size="11" fill="#333">`+"\n")
	item := 0
	at := func() (float64, float64) {
		r, c := item/perRow, item%perRow
		item++
		return float64(plotLeft + c*legendItemW), float64(plotTop+plotHeight+plotBottom+r*legendRowH) + 4
	}
	for _, k := range kinds {
		x, y := at()
		fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="14" height="10" fill="%s" fill-opacity="0.35"/><text x="%.1f" y="%.1f">fault: %s</text>`+"\n",
			x, y, p.kindColor[k], x+18, y+9, esc(k))
	}
	for i, s := range shown {
		x, y := at()
		label := fmt.Sprintf("%s (%d)", s.name, len(p.series[i].pts))
		switch {
		case s.line:
			label = s.name
		case len(s.pts) < len(p.series[i].pts):
			label = fmt.Sprintf("%s (%d, %d drawn)", s.name, len(p.series[i].pts), len(s.pts))
		}
		fmt.Fprintf(b, `<circle cx="%.1f" cy="%.1f" r="4" fill="%s"/><text x="%.1f" y="%.1f">%s</text>`+"\n",
			x+7, y+5, s.color, x+18, y+9, esc(label))
	}
	fmt.Fprintf(b, "</g>\n</svg>\n")
	return height
}

func niceStep(raw float64) float64 {
	if raw <= 0 || math.IsNaN(raw) || math.IsInf(raw, 0) {
		return 1
	}
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if raw <= m*mag {
			return m * mag
		}
	}
	return 10 * mag
}

// yTicks: 0 and ±10^k ms for every decade the data reaches.
func yTicks(ymin, ymax float64) []float64 {
	ticks := []float64{0}
	for v := 1.0; v <= math.Max(ymax, 1)*10; v *= 10 {
		ticks = append(ticks, v)
	}
	for v := 1.0; ymin < 0 && v <= -ymin*10; v *= 10 {
		ticks = append(ticks, -v)
	}
	return ticks
}

func msLabel(v float64) string {
	sign := ""
	if v < 0 {
		sign, v = "-", -v
	}
	switch {
	case v >= 1e6:
		return sign + trimFloat(v/1e6) + "M"
	case v >= 1e3:
		return sign + trimFloat(v/1e3) + "k"
	}
	return sign + trimFloat(v)
}

func trimFloat(v float64) string {
	s := fmt.Sprintf("%.3f", v)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	if s == "-0" {
		s = "0"
	}
	return s
}
