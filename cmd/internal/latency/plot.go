package latency

import (
	"cmp"
	"fmt"
	"html"
	"math"
	"slices"
	"strings"
)

// MaxPoints bounds the dots drawn per plot, so that a page stays light
// with millions of measurements.
const MaxPoints = 20000

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

// Point is one measurement: Y (milliseconds on the symlog axis) at X
// (seconds).
type Point struct{ X, Y float64 }

// Series is one named class of points, drawn as dots, or as a line joining
// them in X order (a NaN Y breaks the line). Series are drawn in order:
// later ones on top. Lines are drawn whole, never downsampled.
type Series struct {
	Name, Color string
	// Radius is a dot's radius, or half a line's width; zero means 1.5.
	Radius float64
	Points []Point
	Line   bool
}

// Band is a span of X shaded under the series (a fault window, say).
// Bands with the same Legend share one legend entry, in the colour of the
// first of them.
type Band struct {
	X0, X1 float64
	Color  string
	Legend string // the legend entry
	Title  string // the tooltip, followed by the span in seconds
}

// Plot is one plot: Y over X, symlog Y unless LinearY.
type Plot struct {
	ID, Title, XLabel, YLabel string
	Series                    []Series
	Bands                     []Band
	// AnnotateMax writes the largest Y next to its dot: with the symlog
	// axis the outliers stay on the plot and are named rather than clipped.
	AnnotateMax bool
	// LinearY draws Y on a linear axis from 0 (rates) instead of symlog
	// (milliseconds).
	LinearY bool
}

// StackSVG draws plots one under the other as a standalone SVG document.
func StackSVG(plots ...Plot) string {
	var body strings.Builder
	y := 0
	for _, p := range plots {
		fmt.Fprintf(&body, "<g transform=\"translate(0 %d)\">\n", y)
		y += Render(&body, p)
		body.WriteString("</g>\n")
	}
	return fmt.Sprintf("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n%s</svg>\n",
		plotWidth, y, body.String())
}

// point and series are Point and Series as the renderer works on them.
type point struct{ x, y float64 }

type series struct {
	name   string
	color  string
	radius float64
	pts    []point
	line   bool
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

// Render writes p as one self-contained <svg> element (every text in it
// escaped) and returns its height. A plot draws at most MaxPoints dots in
// all: dots on the same pixel of the same series are drawn once, then small
// series are kept whole and the rest is sampled evenly in X; the legend
// says how many were drawn.
func Render(b *strings.Builder, p Plot) int {
	all := make([]series, len(p.Series))
	for i, s := range p.Series {
		all[i] = series{name: s.Name, color: s.Color, radius: s.Radius, line: s.Line, pts: make([]point, len(s.Points))}
		if all[i].radius == 0 {
			all[i].radius = 1.5
		}
		for j, pt := range s.Points {
			all[i].pts[j] = point{pt.X, pt.Y}
		}
	}
	return render(b, p, all)
}

func render(b *strings.Builder, p Plot, all []series) int {
	esc := html.EscapeString
	yScale := symlog
	if p.LinearY {
		yScale = func(y float64) float64 { return y }
	}
	// Domain: every dot and every band.
	xmin, xmax := math.Inf(1), math.Inf(-1)
	ymin, ymax := 0.0, 1.0
	for _, s := range all {
		for _, pt := range s.pts {
			if math.IsNaN(pt.y) {
				continue
			}
			xmin, xmax = math.Min(xmin, pt.x), math.Max(xmax, pt.x)
			ymin, ymax = math.Min(ymin, pt.y), math.Max(ymax, pt.y)
		}
	}
	for _, w := range p.Bands {
		xmin = math.Min(xmin, w.X0)
		xmax = math.Max(xmax, w.X1)
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

	shown := downsample(all, px, MaxPoints)

	var legends []string
	legendColor := map[string]string{}
	for _, w := range p.Bands {
		if _, ok := legendColor[w.Legend]; !ok {
			legends = append(legends, w.Legend)
			legendColor[w.Legend] = w.Color
		}
	}
	slices.Sort(legends)
	legendItems := len(legends) + len(all)
	perRow := max(1, (plotWidth-plotLeft)/legendItemW)
	rows := (legendItems + perRow - 1) / perRow
	height := plotTop + plotHeight + plotBottom + rows*legendRowH + 8

	fmt.Fprintf(b, `<svg id="%s" class="plot" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="%s">`+"\n",
		esc(p.ID), plotWidth, height, plotWidth, height, esc(p.Title))
	fmt.Fprintf(b, `<rect x="%d" y="%d" width="%.1f" height="%.1f" fill="#fff" stroke="#888"/>`+"\n", plotLeft, plotTop, innerW, innerH)

	// Bands (fault windows), under everything else.
	fmt.Fprintf(b, `<g class="faults">`+"\n")
	for _, w := range p.Bands {
		x0 := math.Max(sx(w.X0), plotLeft)
		x1 := math.Min(sx(w.X1), plotLeft+innerW)
		fmt.Fprintf(b, `<rect x="%.1f" y="%d" width="%.1f" height="%.1f" fill="%s" fill-opacity="0.16"><title>%s: %.3fs–%.3fs</title></rect>`+"\n",
			x0, plotTop, math.Max(x1-x0, 1), innerH, w.Color, esc(w.Title), w.X0, w.X1)
	}
	fmt.Fprintf(b, "</g>\n")

	// Axes: x ticks at a 1-2-5 step, y ticks at every decade of the symlog axis.
	fmt.Fprintf(b, `<g class="axes" font-size="11" fill="#333">`+"\n")
	step := niceStep((xmax - xmin) / 8)
	for x := math.Ceil(xmin/step) * step; x <= xmax; x += step {
		X := sx(x)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%.1f" stroke="#eee"/>`, X, plotTop, X, plotTop+innerH)
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", X, plotTop+innerH+14, Format(x))
	}
	ticks := yTicks(ymin, ymax)
	if p.LinearY {
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
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", plotLeft+innerW/2, plotTop+innerH+30, esc(p.XLabel))
	fmt.Fprintf(b, `<text transform="translate(14 %.1f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", plotTop+innerH/2, esc(p.YLabel))
	fmt.Fprintf(b, `<text x="%d" y="16" font-size="13" font-weight="bold">%s</text>`+"\n", plotLeft, esc(p.Title))
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
			class, esc(s.name), len(s.pts), len(all[i].pts), s.color, 2*s.radius, cap)
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
	if p.AnnotateMax && maxPt != nil {
		x, y := px(*maxPt)
		anchor := "start"
		if x > plotLeft+innerW*0.8 {
			anchor = "end"
		}
		fmt.Fprintf(b, `<text class="outlier" x="%.1f" y="%.1f" font-size="11" text-anchor="%s" fill="#b00">max %s ms</text>`+"\n",
			x+4, math.Max(y-4, plotTop+10), anchor, Format(maxPt.y))
	}

	// Legend: the bands, then the series with how many points are shown.
	fmt.Fprintf(b, `<g class="legend" font-size="11" fill="#333">`+"\n")
	item := 0
	at := func() (float64, float64) {
		r, c := item/perRow, item%perRow
		item++
		return float64(plotLeft + c*legendItemW), float64(plotTop+plotHeight+plotBottom+r*legendRowH) + 4
	}
	for _, l := range legends {
		x, y := at()
		fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="14" height="10" fill="%s" fill-opacity="0.35"/><text x="%.1f" y="%.1f">%s</text>`+"\n",
			x, y, legendColor[l], x+18, y+9, esc(l))
	}
	for i, s := range shown {
		x, y := at()
		label := fmt.Sprintf("%s (%d)", s.name, len(all[i].pts))
		switch {
		case s.line:
			label = s.name
		case len(s.pts) < len(all[i].pts):
			label = fmt.Sprintf("%s (%d, %d drawn)", s.name, len(all[i].pts), len(s.pts))
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
		return sign + Format(v/1e6) + "M"
	case v >= 1e3:
		return sign + Format(v/1e3) + "k"
	}
	return sign + Format(v)
}

// Format writes v with at most three decimals and no trailing zeros, as
// the plots label their axes: the tables next to a plot use it so that
// their numbers read the same.
func Format(v float64) string {
	s := fmt.Sprintf("%.3f", v)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	if s == "-0" {
		s = "0"
	}
	return s
}
